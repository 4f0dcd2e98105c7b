"""Model families, one folder each (`llmbuild/families/<name>/`), found through `registry.py`.

A family's folder holds what is its own, in modules named by role: its description in `family.py` (a
text family's `Family` value: config reading, tensor layout, checkpoint fix-ups, block hooks, the
transformers class), and, for a family that has them, `runtime` (which imports nothing of the compiler),
`checkpoint`, `synthetic`, `model`, `reference`, `stream`, `verify` and `cost`, each held to its phase's
layer by pyproject.toml's contracts; phase packages reach them through `registry.family_part`. The shared
machinery each hook plugs into stays in its phase package (importer/nets.py builds the block).
"""
