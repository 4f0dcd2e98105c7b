"""The qwen3_5 family (Qwen3.5's text model): its `FAMILY` in family.py, its two token mixers in mixers.py;
registered in llmbuild/families/registry.py."""
