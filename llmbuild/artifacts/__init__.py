"""The files a build writes and later steps read back: where each lives (`paths.py`), the per-layer weight
files the objects point into (`weight_file.py`), and a layer's and the head's weights in the form the
build compiles (`layer_weights.py`, `head_weights.py`). Below the steps and the verification, which share
them."""
