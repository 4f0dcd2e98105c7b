"""The binary format: what a runtime needs to read, check and run a .llmb file, and what the compiler
writes into it. The section container (`container.py`), the program encoding (`program.py`), the checks
a program passes before anything runs it (`validate.py`) and the device-memory map (`memory_map.py`).

It imports numpy and the numerics only: never xDSL, torch, transformers or Snakemake, so a machine that
runs models installs the runtime without the compiler (docs/design.md, "Package layout").
"""
