"""The inputs the vision step checks the vit net on, with the independent reference's output for each: the
family folder's `verify.vision_cases` (InternVL: one pseudo-random tile through transformers' own
`get_image_features`; MiniCPM-V: pieces of several patch grids, fed padded as the runtime feeds them, against
its reference at each piece's own size), and its `vendor_vision_cases`, the same for the bmodel's vit net in
the inputs the vendor's runtime feeds it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmbuild.families.registry import family_part

CHECK_SEED = 20261202
Case = tuple[str, dict[str, np.ndarray], np.ndarray]  # (name, the net's inputs, the reference's features)


def check_cases(family: str, vlm: Path, shapes: dict[str, tuple[int, ...]]) -> list[Case]:
    """`shapes`: the compiled net's inputs by name."""
    return family_part(family, "verify").vision_cases(vlm, CHECK_SEED, shapes)


VendorCase = tuple[str, list[np.ndarray], np.ndarray]  # (name, the bmodel vit net's inputs in order, reference)


def vendor_cases(family: str, vlm: Path, shapes: dict[str, tuple[int, ...]]) -> list[VendorCase]:
    """The cases of the bmodel's vit net (`shapes`: its inputs by name)."""
    return family_part(family, "verify").vendor_vision_cases(vlm, CHECK_SEED, shapes)
