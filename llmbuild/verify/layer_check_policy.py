"""Which layers' checks run on the simulated device (the rest on the host path): a policy of its own so the
Snakefile can size those jobs without importing the executors."""

from __future__ import annotations


def faithful_layers(num_layers: int) -> set[int]:
    """The first, the middle and the last layer. Addresses differ between layers only by their weight and
    cache bases; the first and last sit at both ends of the weight region and of the cache."""
    return {0, num_layers // 2, num_layers - 1}
