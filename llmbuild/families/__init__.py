"""Model families, one folder each (`llmbuild/families/<name>/`), found through `registry.py`.

A family's folder holds what is its own: the `Family` value (config reading, tensor layout, checkpoint
fix-ups, block hooks, the transformers class) in `family.py`, and, for a family that has them, its
runtime part (its module `runtime`, which import nothing of the compiler: pyproject.toml's contracts).
The shared machinery each hook plugs into stays in its phase package (importer/nets.py builds the block).
"""
