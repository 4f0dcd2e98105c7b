"""One module per decoder family, each exporting `ARCHITECTURE`; `llmbuild.frontend.registry` finds them."""

from llmbuild.frontend.arch.base import Architecture, expected_shapes

__all__ = ["Architecture", "expected_shapes"]
