"""The layer-group plans of a net as a module attribute: what `plan-layer-groups` decided, written into the
IR so that `layer-group` builds the groups by reading it, in the same pipeline or in a later run.

A plan holds ops and SSA values (its members, the values it loads and stores, the keys of its local-memory
buffers). In the attribute an op is its position in the net's function body and a value is its defining
op's position and result number (or the function argument number), so the attribute means the same thing
in every copy of the module: a clone, or the module printed and parsed again. The passes between the two
must therefore not add, remove or reorder ops; `layer-group` checks the op count it was planned for.

Every field of `GroupPlan` is written whatever it holds, so a field added later travels too.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.ir import Attribute, BlockArgument, Operation, OpResult

from llmbuild import LlmbuildError
from llmbuild.dialects.plain import main_func
from llmbuild.passes.layer_group_plan import GroupPlan

PLANS_ATTR = "tpu.group_plans"


def write_plans(module: ModuleOp, plans: list[GroupPlan]) -> None:
    ops = list(main_func(module).body.block.ops)
    position = {op: i for i, op in enumerate(ops)}

    def encode(x: Any) -> Attribute:
        if isinstance(x, Operation):
            return DictionaryAttr({"op": IntegerAttr(position[x], i64)})
        if isinstance(x, OpResult):
            return DictionaryAttr({"value": ArrayAttr([IntegerAttr(position[x.op], i64),
                                                       IntegerAttr(x.index, i64)])})
        if isinstance(x, BlockArgument):
            return DictionaryAttr({"arg": IntegerAttr(x.index, i64)})
        if isinstance(x, bool):
            raise TypeError("a GroupPlan field holds a bool: give it an attribute form")
        if isinstance(x, int):
            return IntegerAttr(x, i64)
        if isinstance(x, str):
            return StringAttr(x)
        if isinstance(x, (tuple, list)):
            return ArrayAttr([encode(item) for item in x])
        if isinstance(x, dict):
            return DictionaryAttr({"map": ArrayAttr([ArrayAttr([encode(k), encode(v)]) for k, v in x.items()])})
        raise TypeError(f"a GroupPlan field holds a {type(x).__name__}: give it an attribute form")

    module.attributes[PLANS_ATTR] = DictionaryAttr({
        "ops": IntegerAttr(len(ops), i64),
        "plans": ArrayAttr([DictionaryAttr({f.name: encode(getattr(p, f.name)) for f in fields(p)}) for p in plans]),
    })


def take_plans(module: ModuleOp) -> list[GroupPlan]:
    """The plans `write_plans` put on this module (or on the module it was cloned or printed from); the
    attribute is removed, so the grouped module carries only the groups."""
    attr = module.attributes.pop(PLANS_ATTR, None)
    if not isinstance(attr, DictionaryAttr):
        raise LlmbuildError(f"layer-group: the module has no {PLANS_ATTR}; run plan-layer-groups first")
    fn = main_func(module)
    ops = list(fn.body.block.ops)
    planned = _int(attr.data["ops"])
    if planned != len(ops):
        raise LlmbuildError(f"layer-group: the plans are for {planned} ops, the module has {len(ops)}: "
                            f"a pass between plan-layer-groups and layer-group changed the op list")
    args = fn.body.block.args

    def decode(a: Attribute) -> Any:
        if isinstance(a, IntegerAttr):
            return _int(a)
        if isinstance(a, StringAttr):
            return a.data
        if isinstance(a, ArrayAttr):
            return tuple(decode(item) for item in a.data)
        assert isinstance(a, DictionaryAttr)
        if "op" in a.data:
            return ops[_int(a.data["op"])]
        if "value" in a.data:
            at, n = (_int(x) for x in a.data["value"].data)  # type: ignore[attr-defined]
            return ops[at].results[n]
        if "arg" in a.data:
            return args[_int(a.data["arg"])]
        return {decode(k): decode(v) for k, v in (pair.data for pair in a.data["map"].data)}  # type: ignore[attr-defined]

    plans = []
    for item in attr.data["plans"].data:  # type: ignore[attr-defined]
        values = {f.name: decode(item.data[f.name]) for f in fields(GroupPlan)}
        # Arrays decode as tuples (dict keys and lmem addresses are tuples); list fields get lists back.
        plans.append(GroupPlan(**{f.name: list(values[f.name]) if str(f.type).startswith("list") else values[f.name]
                                  for f in fields(GroupPlan)}))
    return plans


def _int(a: Attribute) -> int:
    assert isinstance(a, IntegerAttr)
    return int(a.value.data)

