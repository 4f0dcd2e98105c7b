"""Numerical evidence: TopOp against the source model (transformers), TpuOp against TopOp, end to end."""
