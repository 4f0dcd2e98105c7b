"""InternVL (InternViT, the pixel shuffle, an MLP projector, a Qwen2): one folder, its modules by role
(family.py lists them)."""
