"""Import: a ModelSpec becomes TopOp modules, one per net (per layer and stage, plus the head nets)."""
