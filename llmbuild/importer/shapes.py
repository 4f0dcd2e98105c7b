"""The static shapes of the three stages: S (KV-cache rows) and L (tokens per prefill call).

Its own module, free of xDSL, because the steps before compilation (prepare, quantize, the reference)
need the shapes too and must not depend on (or rerun for) the compiler's code."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shapes:
    seq_length: int  # S: KV-cache rows
    prefill_length: int  # L: tokens per prefill / prefill_kv call

    def stage_tokens(self, stage: str) -> int:
        return 1 if stage == "decode" else self.prefill_length

    def stage_keys(self, stage: str) -> int:
        """Attention keys per query: the new rows, plus the whole cache for history stages."""
        return {"prefill": self.prefill_length, "prefill_kv": self.seq_length + self.prefill_length,
                "decode": self.seq_length + 1}[stage]
