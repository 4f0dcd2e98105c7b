"""The folder of a synthetic vision-language checkpoint, any family's: `vlm/` beside the synthetic text
checkpoint, with the vision-language config.json, one safetensors file and the text checkpoint's tokenizer
(which then holds the family's image tokens). What goes in it is the family's (its folder's `synthetic`
module: names, shapes, values); this writes it the same way for every family.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

VLM_DIR = "vlm"


def write_vlm_dir(text_dir: Path, config: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> None:
    """`text_dir/vlm/`: `config` as config.json, `tensors` as one model.safetensors in name order, and the
    text checkpoint's tokenizer and generation files (any vision-language family)."""
    import shutil

    from safetensors.numpy import save_file

    from llmbuild.frontend.tokenizer_files import write_json

    out = text_dir / VLM_DIR
    out.mkdir()
    write_json(out / "config.json", config)
    save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(text_dir / name, out / name)
