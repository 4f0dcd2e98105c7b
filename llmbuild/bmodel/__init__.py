"""The vendor's deployable binary: llmbuild's TopOp nets exported to TPU-MLIR's top dialect and compiled
by its own tools (docs/bmodel.md)."""
