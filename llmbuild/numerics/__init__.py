"""Numeric formats and op semantics shared by the reference interpreter and the runtime.

Nothing here depends on xDSL: a deployed runtime executes the same kernels from the binary.
"""
