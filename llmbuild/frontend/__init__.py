"""Frontends: a recipe's source read as a checkpoint. `sources.py` turns a recipe's `source` into a
checkpoint directory and a `TensorSource` (`spec.py`); one reader per format (`hf.py`, `gguf_source.py`,
`synthetic.py`), `arch/` one module per decoder family behind `registry.py`, and the prepare-time scan
(`checkpoint_scan.py`). Readers are imported where they are used, so importing a module here stays cheap.
"""
