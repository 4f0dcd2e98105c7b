"""The qwen2 family: its `FAMILY` in family.py; registered in llmbuild/families/registry.py."""
