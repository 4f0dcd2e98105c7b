"""MiniCPM-V 2.6 (SigLIP, the resampler, a Qwen2): one folder, its modules by role (family.py lists them)."""
