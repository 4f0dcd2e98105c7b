"""The vendor's deployable binary: llmbuild's TopOp nets exported to TPU-MLIR's top dialect, compiled by its own tools."""
