"""Resolve a recipe's `quantization` section against its source checkpoint.

A quantized checkpoint (config.json with `quantization_config`) decides the weight bits and the group
size itself: the recipe may say `mode: auto` and take them, or name a mode, which must agree. A float
checkpoint is quantized in the build, by round-to-nearest or by a library method. Every mismatch is
an error here, at load time, so no build step starts on a recipe that cannot mean what it says.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.recipe_types import DEFAULT_CALIBRATION, LIBRARY_METHODS, CheckpointQuant

# fail(field, message) -> the error to raise, located at the field's line (or the section's).
Fail = Callable[[str, str], LlmbuildError]


def checkpoint_quantization(config_path: Path) -> CheckpointQuant | None:
    """The quantization a checkpoint's config.json declares, or None for a float checkpoint."""
    from llmbuild.quant.config import detect_quantization

    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LlmbuildError(f"{config_path}: cannot read JSON: {exc}") from None
    if not isinstance(config, dict) or not isinstance(config.get("quantization_config"), dict):
        return None
    info = detect_quantization(config, origin=str(config_path))
    return CheckpointQuant(method=info.method, bits=info.bits, group_size=info.group_size, sym=info.sym,
                           desc_act=info.desc_act)


def resolve(q: dict[str, Any], given: set[str], kind: str, config_path: Path | None, data_dir: Path,
            fail: Fail) -> dict[str, Any]:
    """The quantization section with `mode: auto`, the group size and the checkpoint's facts resolved."""
    q = dict(q)
    if q["lm_head"] != "float" and not (q["mode"].startswith("w") or q["mode"] == "auto"):
        raise fail("quantization.lm_head", f"expected float for float mode {q['mode']}, got {q['lm_head']}")
    found = checkpoint_quantization(config_path) if kind == "hf" and config_path is not None else None
    mode, method = q["mode"], q["method"]
    if found is not None:
        source = f"{config_path} is a {found.bits}-bit {found.method} checkpoint"
        if method != "auto":
            raise fail("quantization.method", f"expected auto (import as it is): {source}; "
                                              f"{method} needs a float checkpoint, got {method}")
        if mode == "auto":
            mode = f"w{found.bits}bf16"
        elif not mode.startswith(f"w{found.bits}"):
            raise fail("quantization.mode", f"expected auto, w{found.bits}bf16 or w{found.bits}f16 "
                                            f"({source}), got {mode}")
        if "quantization.group_size" in given and q["group_size"] != found.group_size:
            raise fail("quantization.group_size", f"expected {found.group_size} or nothing ({source} "
                                                  f"with group size {found.group_size}), got {q['group_size']}")
        q.update(mode=mode, group_size=found.group_size, checkpoint=found)
        return q
    if mode == "auto":
        what = "an hf source" if kind != "hf" else f"a quantized checkpoint ({config_path} has no quantization_config)"
        raise fail("quantization.mode", f"expected f32, bf16, f16 or w4/w8 modes: auto needs {what}, got auto")
    if method != "auto" and not mode.startswith("w"):
        raise fail("quantization.method", f"expected auto for float mode {mode} (methods make w4/w8 weights), "
                                          f"got {method}")
    if method in LIBRARY_METHODS:
        calibration = Path(q["calibration"]) if q["calibration"] else data_dir / DEFAULT_CALIBRATION
        if not calibration.is_file():
            raise fail("quantization.calibration", f"expected a text file, got {calibration} (not found)")
        q["calibration"] = str(calibration)
        from llmbuild.quant.methods import check_options

        try:
            check_options(method, q["options"])
        except LlmbuildError as exc:
            raise fail("quantization.options", f"expected options of {method}: {exc}") from None
    elif q["options"]:
        raise fail("quantization.options", f"expected no options for method {method} (they are for "
                                           f"{', '.join(LIBRARY_METHODS)}), got {', '.join(q['options'])}")
    q["checkpoint"] = None
    return q
