"""An ONNX file read for import: external data, onnx's checker, constant folding and static shapes.

A vision tower reaches llmbuild as ONNX (torch.onnx's legacy exporter at opset 17, or its dynamo exporter
at opset 18, which writes the weights to an external `.onnx.data` file). Both leave work for a compiler:
the legacy one keeps Shape/Gather/Concat chains that compute constant shapes, and a bicubic Resize of the
position embedding that tracing inserts. onnxscript's optimizer (the one torch.onnx itself runs) folds
most of them; what it leaves by design (ConstantOfShape and what depends on it) is evaluated here node by
node with onnx's own reference implementation, so every node that `OnnxGraph.nodes` keeps computes from
the graph's inputs, and every other value is a constant in `OnnxGraph.constants`. onnx's shape inference
then gives every kept value its static shape: the importer takes shapes from the graph, never guesses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError

FLOAT_TYPES = ("FLOAT", "FLOAT16", "BFLOAT16", "DOUBLE")  # onnx_ir DataType names
SHAPE_VALUE_LIMIT = 1 << 16  # elements: a float constant above this is a weight, not a value shapes depend on


@dataclass(frozen=True)
class OnnxNode:
    op: str
    inputs: tuple[str, ...]  # "" for an omitted optional input
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    name: str


@dataclass
class OnnxGraph:
    path: Path
    opset: int
    inputs: dict[str, tuple[int, ...]]  # graph inputs (not initializers), static shapes
    outputs: list[str]
    nodes: list[OnnxNode]  # in topological order; each reads at least one graph input's descendant
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # every non-constant value
    integer_inputs: frozenset[str] = frozenset()  # graph inputs of an integer type (indices: position ids)


def load_onnx(path: Path) -> OnnxGraph:
    """The graph of `path` (with its external data beside it), folded and with static shapes."""
    import onnx
    import onnxscript.optimizer
    from onnx import numpy_helper, shape_inference
    from onnxscript import ir

    path = Path(path)
    try:
        # Checked by path and read through onnx_ir: external data (a real tower's 1.2 GB of float32 weights,
        # beside the graph) stays on disk until each constant is read once below; onnx.load and the
        # checker's serialized copy would hold it three times over.
        if not path.is_file():
            raise FileNotFoundError(2, "not found", str(path))
        onnx.checker.check_model(str(path))
        graph_ir = ir.load(str(path))
    except FileNotFoundError as exc:
        raise LlmbuildError(f"{path}: {exc.strerror or 'not found'}: {exc.filename} (external data is read "
                            "from beside the .onnx file)") from None
    except Exception as exc:  # noqa: BLE001 - onnx raises many kinds; the user gets one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LlmbuildError(f"{path}: not a valid ONNX model: {first}") from None
    onnxscript.optimizer.optimize_ir(graph_ir, num_iterations=4, should_fold=_fold_unless_weight_transpose)
    model = ir.serde.serialize_model(graph_ir)  # external initializers stay references to the file
    del graph_ir
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    constants = {t.name: numpy_helper.to_array(t, base_dir=str(path.parent)) for t in model.graph.initializer}
    # Their values live in `constants` from here: a 300M tower's weights are 1.2 GB in float32, and every
    # further copy (the proto's, the folded graph's, shape inference's serialized ones) would be as much.
    model.graph.ClearField("initializer")
    kept = []
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            raise LlmbuildError(f"{path}: node {n.name or n.op_type}: operator domain {n.domain!r} is not "
                                "supported (expected the standard ONNX operators)")
        node = OnnxNode(n.op_type, tuple(n.input), tuple(n.output),
                        {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}, n.name)
        if all(not i or i in constants for i in node.inputs):
            constants.update(_evaluate(node, constants, opset))
        else:
            kept.append((n, node))
    # The folded graph again, its constants as initializers, so that shape inference sees them as values;
    # large float ones (weights, which never carry shapes) as typed inputs, so that they are not copied.
    used = {i for n, _ in kept for i in n.input} | {o.name for o in model.graph.output}
    weights = {k for k, v in constants.items() if k in used and v.size > SHAPE_VALUE_LIMIT and v.dtype.kind == "f"}
    typed = [onnx.helper.make_tensor_value_info(k, onnx.helper.np_dtype_to_tensor_dtype(constants[k].dtype),
                                                constants[k].shape) for k in sorted(weights)]
    folded = onnx.helper.make_graph(
        [n for n, _ in kept], model.graph.name, [*model.graph.input, *typed], list(model.graph.output),
        [numpy_helper.from_array(v, k) for k, v in constants.items() if k in used and k not in weights])
    model = shape_inference.infer_shapes(onnx.helper.make_model(folded, opset_imports=list(model.opset_import),
                                                                ir_version=model.ir_version),
                                         strict_mode=True, data_prop=True)
    graph = model.graph
    inputs = {i.name: _static_shape(i, path) for i in graph.input if i.name not in constants}
    shapes = {v.name: _static_shape(v, path) for v in [*graph.value_info, *graph.output]}
    shapes.update(inputs)
    integer = frozenset(i.name for i in graph.input if i.name in inputs and i.type.tensor_type.elem_type in (
        onnx.TensorProto.INT32, onnx.TensorProto.INT64))
    return OnnxGraph(path, opset, inputs, [o.name for o in graph.output], [node for _, node in kept],
                     constants, shapes, integer)


def _fold_unless_weight_transpose(node: Any) -> bool | None:
    """onnxscript's folding rule for `node`, except a Transpose of a float initializer (a weight): onnxscript
    writes it as a new tensor (a copy of the weight), where `_evaluate` below gives a view of it that the
    importer, which stores a product's weight transposed, turns back into the stored tensor without copying."""
    if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return None
    source = node.inputs[0]
    value = source.const_value if source is not None else None
    return False if value is not None and value.dtype.name in FLOAT_TYPES else None


def _static_shape(value: Any, path: Path) -> tuple[int, ...]:
    dims = value.type.tensor_type.shape.dim
    if any(not d.HasField("dim_value") for d in dims):
        shown = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
        raise LlmbuildError(f"{path}: value {value.name!r} has a dynamic shape {shown}: export with a fixed "
                            "image size (the recipe's vision.image_size)")
    return tuple(int(d.dim_value) for d in dims)


def _evaluate(node: OnnxNode, constants: dict[str, np.ndarray], opset: int) -> dict[str, np.ndarray]:
    """One node whose inputs are all constants, run by onnx's reference implementation."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    proto = onnx.helper.make_node(node.op, list(node.inputs), list(node.outputs), **node.attrs)
    evaluator = ReferenceEvaluator(proto, opsets={"": opset})
    feeds = {i: constants[i] for i in node.inputs if i}
    values = evaluator.run(None, feeds)
    return {name: np.asarray(v) for name, v in zip(node.outputs, values, strict=True) if name}
