"""The vendor's top dialect as text: one module in MLIR's generic form, with the named locations TPU-MLIR
reads (an input's name, an output's name, a weight's key in the npz file all come from `loc`).

The printer knows nothing of models: `top_export.py` decides which ops to write. What it pins is the
attribute set of each op: every attribute TPU-MLIR 1.30.2's `llm_convert` writes is written here explicitly
with the same value, so that no default of the vendor's op definitions (some of which silently change the
result: `Rope.rope_mode`, `FAttention.keep_dims`) is left to chance, and a module from llmbuild parses to the
same IR as the incumbent's. tests/test_bmodel_export.py checks the pinned values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# Element types as the vendor's modules spell them.
F32, SI32, UI8, BF16, F16 = "f32", "si32", "ui8", "bf16", "f16"
# A weight's element type from its array's: levels are bytes, bf16 is its bit patterns (formats.STORAGE's
# uint16), f16 numpy's float16; the npz holds both 16-bit types as uint16 bit patterns, as TPU-MLIR's own
# weight files do (its npz writer takes no 2-byte float).
_ELEMENT = {np.dtype(np.uint8): UI8, np.dtype(np.uint16): BF16, np.dtype(np.float16): F16}


def tensor_type(shape: Sequence[int], element: str = F32) -> str:
    return "tensor<" + "x".join(str(int(d)) for d in shape) + f"x{element}>"


def f64(value: float) -> str:
    # repr round-trips a double exactly; MLIR wants an exponent or a point in a float literal.
    text = repr(float(value))
    if not np.isfinite(value):
        raise ValueError(f"attribute value {value} is not finite")
    if "." not in text:
        mantissa, _, exponent = text.partition("e")
        text = mantissa + ".0" + ("e" + exponent if exponent else "")
    return text + " : f64"


def i64(value: int) -> str:
    return f"{int(value)} : i64"


def si32(value: int) -> str:
    return f"{int(value)} : si32"


def boolean(value: bool) -> str:
    return "true" if value else "false"


def string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def int_array(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


# The attributes `llm_convert` writes for each op, in its (alphabetical) order; callers add the op's own.
ELEMENTWISE = {"do_relu": boolean(False), "is_scalar": boolean(False), "relu_limit": f64(-1.0)}
MATMUL = {
    "do_relu": boolean(False), "dq_type": string("NONE"), "hdim_is_batch": boolean(False),
    "is_lora": boolean(False), "keep_dims": boolean(True), "left_transpose": boolean(False),
    "output_transpose": boolean(False), "q_group_size": i64(0), "relu_limit": f64(-1.0),
}
GATHER = {"is_lora": boolean(False), "is_scalar": boolean(False), "keepdims": boolean(True)}
ROPE = {
    "add_round_mode": string("HalfAwayFromZero"), "add_saturation": boolean(True), "add_shift": si32(0),
    "force_f32": boolean(False), "is_permute_optimize": boolean(False),
    "mul1_round_mode": string("HalfAwayFromZero"), "mul1_saturation": boolean(True), "mul1_shift": si32(0),
    "mul2_round_mode": string("HalfAwayFromZero"), "mul2_saturation": boolean(True), "mul2_shift": si32(0),
    # The default is "interleaved_pairs"; Qwen and Llama rotate the two halves of a head.
    "rope_mode": string("contiguous_halves"),
}
CONCAT = {"do_relu": boolean(False), "only_merge": boolean(True), "relu_limit": f64(-1.0),
          "round_mode": string("HalfAwayFromZero")}
# keep_dims defaults to true, which gives a [.., heads, dim] result where the model continues with [.., hidden].
FATTENTION = {"keep_dims": boolean(False), "mask_size": si32(0)}
TOPK = {"largest": boolean(True), "replace_topk_indices": boolean(False), "sorted": boolean(True),
        "use_hau": boolean(True)}


@dataclass
class Value:
    name: str  # "%7"
    type: str  # "tensor<1x16x64xf32>" or "none"
    shape: tuple[int, ...] = ()


@dataclass
class VendorModule:
    """One net being written: `input`, `weight` and `op` append in order; `text()` prints the module."""

    net: str
    weight_file: str  # the npz path as tpuc-opt reads it, relative to the net's own directory
    args: list[tuple[str, Sequence[int], str]] = field(default_factory=list)  # name, shape, element
    lines: list[str] = field(default_factory=list)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: list[Value] = field(default_factory=list)
    _count: int = 0

    def __post_init__(self) -> None:
        self.none = self._emit('"top.None"() : () -> none', "none", (), None)

    def _emit(self, body: str, type_: str, shape: Sequence[int], loc: str | None) -> Value:
        value = Value(f"%{self._count}", type_, tuple(int(d) for d in shape))
        self._count += 1
        where = f"loc({string(loc)})" if loc is not None else "loc(unknown)"
        self.lines.append(f"    {value.name} = {body} {where}")
        return value

    def input(self, name: str, shape: Sequence[int], element: str = F32) -> Value:
        """A net input; integer inputs (ids, positions) are si32 arguments whose `top.Input` is typed f32."""
        index = len(self.args)
        self.args.append((name, shape, element))
        out = tensor_type(shape)
        body = f'"top.Input"(%arg{index}) {{do_preprocess = false}} : ({tensor_type(shape, element)}) -> {out}'
        return self._emit(body, out, shape, name)

    def weight(self, key: str, array: np.ndarray) -> Value:
        """A weight: `key` is both its npz key and its location (TPU-MLIR finds the data by the loc). Levels
        (uint8) and 16-bit storage (uint16 bf16 bit patterns, float16) keep their type; anything else is
        float32, the top dialect's type."""
        if key in self.weights:
            raise ValueError(f"net {self.net}: weight {key} written twice")
        element = _ELEMENT.get(array.dtype, F32)
        data = np.ascontiguousarray(array, dtype=array.dtype if element != F32 else np.float32)
        self.weights[key] = data.view(np.uint16) if element == F16 else data
        out = tensor_type(data.shape, element)
        return self._emit(f'"top.Weight"() : () -> {out}', out, data.shape, key)

    def placeholder(self, key: str, array: np.ndarray) -> Value:
        """A weight this net declares but does not use (LLM-TPU's decode nets name the prefill nets' mask so
        that a layer's nets keep one weight layout and share one copy on the device). Its data is still in
        the npz: the vendor reads every declared weight (the incumbent's nets share one npz per layer)."""
        data = np.ascontiguousarray(array, dtype=np.float32)
        self.weights[key] = data
        out = tensor_type(data.shape)
        return self._emit(f'"top.Weight"() {{placeholder = "F32"}} : () -> {out}', out, data.shape, key)

    def op(self, name: str, operands: Sequence[Value], shape: Sequence[int], loc: str,
           attrs: dict[str, str] | None = None) -> Value:
        out = tensor_type(shape)
        return self._emit(_body(name, operands, attrs, out), out, shape, loc)

    def topk_indices(self, x: Value, loc_values: str, loc_indices: str) -> Value:
        """Top-1 over axis 1, returning the indices (the token id, typed f32 as the vendor does)."""
        attrs = {"K": i64(1), "axis": i64(1), **TOPK}
        out = tensor_type((1, 1))
        index = self._count
        self._count += 1
        body = _body("top.TopK", [x], attrs, f"({out}, {out})")
        self.lines.append(f"    %values{index}, %indices{index} = {body} "
                          f"loc(fused[{string(loc_values)}, {string(loc_indices)}])")
        return Value(f"%indices{index}", out, (1, 1))

    def output(self, *values: Value) -> None:
        self.outputs.extend(values)

    def text(self) -> str:
        args = ", ".join(f"%arg{i}: {tensor_type(s, e)} loc(unknown)" for i, (_, s, e) in enumerate(self.args))
        results = ", ".join(v.type for v in self.outputs)
        result_sig = results if len(self.outputs) == 1 else f"({results})"
        attrs = (f'module.chip = "ALL", module.platform = "LLM", module.state = "TOP_F32", '
                 f'module.top_run_mode = "STATIC", module.weight_file = {string(self.weight_file)}')
        head = [f"module @{self.net} attributes {{{attrs}}} {{",
                f"  func.func @main({args}) -> {result_sig} {{"]
        ret = (f"    return {', '.join(v.name for v in self.outputs)} : {results} loc(unknown)")
        return "\n".join([*head, *self.lines, ret, "  } loc(unknown)", "} loc(unknown)", ""])


def _body(name: str, operands: Sequence[Value], attrs: dict[str, str] | None, out: str) -> str:
    ins = ", ".join(v.name for v in operands)
    in_types = ", ".join(v.type for v in operands)
    attr_text = ""
    if attrs:
        attr_text = " {" + ", ".join(f"{k} = {attrs[k]}" for k in sorted(attrs)) + "}"
    return f'"{name}"({ins}){attr_text} : ({in_types}) -> {out}'


__all__ = ["VendorModule", "Value", "tensor_type", "F32", "SI32", "UI8"]
