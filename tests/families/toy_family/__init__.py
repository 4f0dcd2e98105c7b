"""A test-only family whose block differs from the shipped ones: its folder is all it needs."""
