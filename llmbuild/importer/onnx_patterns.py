"""The tanh GELU of an ONNX graph found and replaced by one `GeluTanh` node before the import walk.

SigLIP (MiniCPM-V's tower) uses `gelu_pytorch_tanh`: x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³))), which
the exporters write as a dozen elementwise nodes in an order that depends on the exporter and the torch
version. Rather than follow each order, a region is taken around every `Tanh`: x is the other activation
operand of the product that reads `1 + tanh(...)`, the region is every node on a path from x to the end of
the chain after the Tanh, and it is accepted only when (a) its intermediate values are read nowhere else
and (b) onnx's reference implementation of the region, run on sample values of x, is the tanh GELU of x.
The region then becomes one node, so the importer sees `GeluTanh(x)` (top.GELUTanh).
"""

from __future__ import annotations

import math

import numpy as np

from llmbuild.frontend.onnx_model import OnnxGraph, OnnxNode

ELEMENTWISE = ("Add", "Mul", "Pow", "Div", "Sub")
SAMPLES = np.linspace(-6.0, 6.0, 97, dtype=np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def fuse_gelu_tanh(graph: OnnxGraph) -> list[OnnxNode]:
    """graph.nodes with every tanh GELU region replaced by a `GeluTanh` node (in topological order)."""
    nodes = list(graph.nodes)
    for tanh in [n for n in nodes if n.op == "Tanh"]:
        region = _region(graph, nodes, tanh)
        if region is None:
            continue
        members, x, out = region
        first = min(nodes.index(n) for n in members)
        kept = [n for n in nodes if n not in members]
        kept.insert(min(first, len(kept)), OnnxNode("GeluTanh", (x,), (out,), {}, tanh.name or out))
        nodes = kept
    return nodes


def _consumers(nodes: list[OnnxNode], value: str) -> list[OnnxNode]:
    return [n for n in nodes if value in n.inputs]


def _region(graph: OnnxGraph, nodes: list[OnnxNode], tanh: OnnxNode) -> tuple[list[OnnxNode], str, str] | None:
    """(the region's nodes, x, its output) when the Tanh is part of a tanh GELU, else None."""
    producer = {o: n for n in nodes for o in n.outputs}
    # Forward: the chain after the Tanh, up to three single-consumer elementwise nodes; x is an activation
    # operand of one of them that is not the chain itself.
    chain, value, x = [], tanh.outputs[0], None
    for _ in range(3):
        users = _consumers(nodes, value)
        if len(users) != 1 or users[0].op not in ELEMENTWISE:
            break
        node = users[0]
        others = [i for i in node.inputs if i != value and i not in graph.constants]
        if x is None and len(others) == 1:
            x = others[0]
        elif others:
            break
        chain.append(node)
        value = node.outputs[0]
    if x is None or not chain:
        return None
    # Backward: every node on a path from x to the Tanh's input.
    back: list[OnnxNode] = []
    stack = [tanh.inputs[0]]
    while stack:
        v = stack.pop()
        if v == x or v in graph.constants:
            continue
        node = producer.get(v)
        if node is None or node.op not in ELEMENTWISE or len(back) > 12:
            return None
        if node not in back:
            back.append(node)
            stack.extend(node.inputs)
    # The shortest chain end whose value is the tanh GELU of x, its inner values read only inside.
    for end in range(1, len(chain) + 1):
        members = sorted([*back, tanh, *chain[:end]], key=nodes.index)
        out = chain[end - 1].outputs[0]
        inner = {o for n in members for o in n.outputs if o != out}
        if any(u not in members for v in inner for u in _consumers(nodes, v)) or any(v in graph.outputs for v in inner):
            continue
        if _computes_gelu_tanh(graph, members, x, out):
            return members, x, out
    return None


def _computes_gelu_tanh(graph: OnnxGraph, members: list[OnnxNode], x: str, out: str) -> bool:
    """Whether the region (in topological order) computes the tanh GELU of x on sample values."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    protos = [onnx.helper.make_node(n.op, list(n.inputs), list(n.outputs), **n.attrs) for n in members]
    feeds = {x: SAMPLES}
    for n in members:
        for i in n.inputs:
            if i in graph.constants:
                feeds[i] = graph.constants[i]
    try:
        evaluator = ReferenceEvaluator(onnx.helper.make_model(onnx.helper.make_graph(
            protos, "gelu", [onnx.helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, None) for k in feeds],
            [onnx.helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None)]),
            opset_imports=[onnx.helper.make_opsetid("", graph.opset)]))
        (got,) = evaluator.run(None, feeds)
    except Exception:  # noqa: BLE001 - a region onnx cannot run alone is no GELU
        return False
    got = np.asarray(got, np.float64)
    return got.shape == SAMPLES.shape and bool(np.allclose(got, gelu_tanh(SAMPLES.astype(np.float64)), atol=1e-5))
