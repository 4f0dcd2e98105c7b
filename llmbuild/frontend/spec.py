"""The tensor source protocol: every checkpoint reader (HF safetensors, GGUF, synthetic) produces a
`ModelSpec` and a `TensorSource` that serves tensors one at a time under canonical names, so the importer
never holds a whole model. `ModelSpec` and its JSON form live with the families (llmbuild/families/spec.py,
whose docstring lists the canonical names), which describe themselves with it; they are named here too, as
the readers and the phases after them have always imported them.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from llmbuild.families.spec import ModelSpec, spec_from_json, spec_to_json

__all__ = ["ModelSpec", "TensorSource", "spec_from_json", "spec_to_json"]


class TensorSource(Protocol):
    """Serves one tensor at a time; implementations keep files memory-mapped, never the whole model."""

    spec: ModelSpec

    def tensor(self, name: str) -> np.ndarray:
        """The canonical tensor `name` as a float32 array; LlmbuildError naming it if absent or malformed."""
        ...

    def names(self) -> list[str]:
        """All canonical tensor names the checkpoint holds."""
        ...
