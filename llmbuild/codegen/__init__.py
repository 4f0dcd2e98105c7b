"""Code generation: tpu nets become programs, programs and weights are linked into one binary."""
