"""A vision tower's encoder layers made from the checkpoint one at a time, as they run: what the streamed
image references of the vision-language families (their folders' `stream` modules) build their towers with,
so that no reference holds a real-size tower (a 300M tower's layer is 50 MB in float32).
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from llmbuild.verify.stream_model import aligned


class StreamedVisionLayer(nn.Module):
    """Stands in for the tower's encoder layer `index`: made from the checkpoint while it runs."""

    def __init__(self, template: nn.Module, prefix: str, view: Any) -> None:
        super().__init__()
        self._parts = [template, view]  # a list: not registered, so no meta parameters show
        self.prefix = prefix

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        template, view = self._parts
        module = copy.deepcopy(template)
        state = {key: aligned(view.get(self.prefix + key)) for key in template.state_dict()}
        module.load_state_dict(state, strict=True, assign=True)
        return module.eval()(*args, **kwargs)
