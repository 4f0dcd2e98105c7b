"""canonicalize: local simplifications that every later pass may rely on.

- a Reshape whose input already has its result shape is removed;
- a Reshape of a Reshape reads the first one's input (so address assignment sees one alias, not two).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from llmbuild.dialects import top


class RemoveIdentityReshape(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.ReshapeOp, rewriter: PatternRewriter) -> None:
        if op.input.type == op.output.type:
            rewriter.replace(op, [], [op.input])


class FoldReshapeChain(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: top.ReshapeOp, rewriter: PatternRewriter) -> None:
        producer = op.input.owner
        if isinstance(producer, top.ReshapeOp):
            rewriter.replace(
                op,
                top.ReshapeOp.create(
                    operands=[producer.input], result_types=[op.output.type], attributes=dict(op.attributes)
                ),
            )


@dataclass(frozen=True)
class Canonicalize(ModulePass):
    name = "canonicalize"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        patterns = GreedyRewritePatternApplier([RemoveIdentityReshape(), FoldReshapeChain()])
        PatternRewriteWalker(patterns).rewrite_module(op)
        _drop_dead_ops(op)


def _drop_dead_ops(module: ModuleOp) -> None:
    """Erase side-effect-free top ops whose results nobody reads (left behind by the folds)."""
    changed = True
    while changed:
        changed = False
        for op in list(module.walk()):
            removable = op.name.startswith("top.") and op.name != "top.Input" and op.results
            if removable and all(not r.uses for r in op.results):
                op.detach()
                op.erase()
                changed = True
