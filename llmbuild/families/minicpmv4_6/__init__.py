"""MiniCPM-V 4.6 (Qwen3.5 text model, SigLIP with a window-attention merger, a 2x2 downsample merger)."""
