"""llmbuild's TopOp net, printed as the vendor's top module (plus the npz of its weights) that TPU-MLIR's own
lowering and code generation turn into a `.bmodel` net.

The translation walks the TopOp net op by op; what changes on the way is the vendor's contract, not the
model's semantics (../docs/bmodel.md):
- names: inputs, outputs and weights take the names LLM-TPU's runtime and `llm_convert` use (HF tensor names
  with `model.`, `input_states`, `output_states`, `k_cache`, `v_cache`, `token_id`);
- layouts: linear weights [K, N] (TopOp keeps the checkpoint's [N, K]), norm weights and biases with leading
  ones, RoPE tables [S, 1, d] gathered straight into [1, n, 1, d], 4-bit levels two to a byte;
- net boundaries: the final RMSNorm moves from `lm_head` into the last layer's block nets, and `lm_head`
  ends in a top-1 on the chip (it returns the token id);
- the levels of a quantized projection are passed as they are (`top.A16MatMul`), so a GPTQ, AWQ or
  AutoRound checkpoint's levels, zero points and scales are what the chip multiplies by; act order's input
  permutation stays a `top.Gather` on the activations. An 8-bit table only gathered (a tied, quantized
  embedding) is dequantized in float32 here: the vendor has no quantized gather, and its BF16 lowering rounds
  the table to the bf16 values the `.llmb` computes from the same levels.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Operation, SSAValue

from llmbuild import LlmbuildError
from llmbuild.bmodel import vendor_ir as ir
from llmbuild.dialects import common, top
from llmbuild.importer.nets import ROPE_COS, ROPE_SIN
from llmbuild.numerics.dequantize import dequantize_uncached
from llmbuild.numerics.stored import encoded, materialize
from llmbuild.quant.pack import device_zero_points, pack_levels

# llmbuild's per-layer location suffixes -> the vendor's (after `model.layers.{i}.`, or absolute).
_LAYER_LOCS = {
    "input_norm": "input_layernorm",
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "q_heads": "self_attn.q_proj.reshape", "k_heads": "self_attn.k_proj.reshape", "v_heads": "/v_cache",
    "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
    "q_rope": "/q_proj", "k_rope": "/k_cache",
    "k_concat": "self_attn.k_proj.concat", "v_concat": "self_attn.v_proj.concat",
    "attention": "fattention", "attn_residual": "self_attn.o_proj.add",
    "post_norm": "post_attention_layernorm",
    "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj",
    "gate_silu": "mlp.gate_proj.silu", "gate_mul": "mlp.up_proj.mul",
    "mlp_residual": "mlp.down_proj.add",
}
_INPUT_NAMES = {"hidden_states": "input_states"}  # block nets; lm_head keeps "hidden_states"
_ROPE_KEYS = {ROPE_COS: ("rotary_cos.weight", "rotary_cos"), ROPE_SIN: ("rotary_sin.weight", "rotary_sin")}


class ExportError(LlmbuildError):
    """A net the vendor's top dialect cannot express as llmbuild compiled it; the message names the net."""


# The causal mask of dynamic prefill nets, a weight of the vendor's fixed size (lanes x 4) instead of an input.
MASK_WEIGHT = "attention_mask.weight"
MASK_VALUE = -1.0e9


@dataclass(frozen=True)
class DynamicPrefill:
    """LLM-TPU's history form (`llm_convert --use_history_kv`): prefill nets take no mask input; their
    attention reads a [size, size] causal mask weight and the lengths the runtime passes. Decode nets declare
    the same weight as a placeholder, which keeps a layer's weight layout one for its three nets."""

    mask_size: int

    def mask(self) -> np.ndarray:
        return np.triu(np.full((self.mask_size, self.mask_size), MASK_VALUE, np.float32), k=1)


@dataclass(frozen=True)
class FinalNorm:
    """The model's last RMSNorm, which the vendor computes at the end of the last layer's block nets."""

    gamma: np.ndarray
    eps: float


def vendor_weight_key(name: str) -> str:
    """llmbuild's canonical tensor name -> the HF name `llm_convert` uses as the npz key."""
    if name == "lm_head.weight":
        return name
    return "model." + name


def export_net(module: ModuleOp, weights: Mapping[str, np.ndarray], weight_file: str,
               final_norm: FinalNorm | None = None, dynamic: DynamicPrefill | None = None,
               explicit_attention: bool = False, table_storage: str | None = None,
               table_parts: int = 1, logits_net: str | None = None) -> ir.VendorModule:
    """`module`: one TopOp net as the layer or head step built it (canonicalized or not); `weights`: its
    TopOp weights by name (arrays, or RowReaders read when the net uses them); `weight_file`: the npz path
    the module names; `dynamic`: the history form of the block nets (else static nets with a mask input).
    Returns the vendor module, whose `weights` are the npz contents. `explicit_attention`: attention as its
    products and softmax (f32 nets: `attention_ops`). `table_storage`: the 16-bit type (bf16, f16) the net
    computes in, in which its vocabulary table (the embedding's, lm_head's) is declared: rounded here to
    nearest-even as TPU-MLIR's lowering would round it from float32 (the same bmodel, tests/test_bmodel_build.py),
    so the vendor's lowering holds the table once in 16 bits instead of three float32 copies (a 7B's
    lm_head: 1.1 GB instead of 6.4). `table_parts`: that table as this many weights, each with its own op,
    joined by a Concat (lm_head's rows, the embedding's columns: the same values, the same gather and the same
    top-1), because the vendor's code generator holds about four copies of a table given as one weight and
    three given in parts (steps/resources.py's `vocab_table_parts` decides). `logits_net`: lm_head exported as
    the net of this name whose output is the logits, before the top-1 (the check's twin: the same ops and the
    same weights up to the top-1)."""
    fn = next(op for op in module.ops if isinstance(op, FuncOp))
    net = module.attributes["top.net"].data  # type: ignore[attr-defined]
    if logits_net is not None and net != "lm_head":
        raise ExportError(f"net {logits_net}: exported from lm_head's TopOp net, not {net}'s")
    return NetExporter(net, weights, weight_file, final_norm, dynamic, explicit_attention,
                       table_storage, table_parts, logits_net).run(fn)


class NetExporter:
    """One net's translation; bmodel/vit_export.py's exporter specializes it for the vision tower."""

    concat_attrs = ir.CONCAT  # the decoder's K/V history concatenation merges in place (only_merge)

    def __init__(self, net: str, weights: Mapping[str, np.ndarray], weight_file: str,
                 final_norm: FinalNorm | None, dynamic: DynamicPrefill | None, explicit_attention: bool,
                 table_storage: str | None = None, table_parts: int = 1, logits_net: str | None = None):
        self.net = net
        self.logits_only = logits_net is not None
        self.table_storage = table_storage
        self.table_parts = table_parts
        self.explicit_attention = explicit_attention
        self.weights = weights
        self.final_norm = final_norm
        self.dynamic = dynamic
        self.out = ir.VendorModule(logits_net or net, weight_file)
        self.values: dict[SSAValue, ir.Value] = {}
        self.is_block = net.startswith("block")
        self.prefill = net.startswith(("block_", "block_kv_")) and not net.startswith("block_cache_")

    def fail(self, message: str) -> ExportError:
        return ExportError(f"net {self.net}: {message}")

    def run(self, fn: FuncOp) -> ir.VendorModule:
        """Ops in TopOp's order, but for two moves that give the incumbent's order (its converter writes the
        q, k and v reshapes after the three projections, and a gate's SiLU right after the gate), so that the
        vendor's passes see the op sequence `llm_convert` gives them and the bmodel is the same."""
        deferred: list[Operation] = []  # q/k/v reshapes, written when the projections are done
        for op in fn.body.block.ops:
            if isinstance(op, top.WeightOp):
                continue  # weights are written where they are used
            if deferred and not self.part_of_projections(op):
                for reshape in deferred:
                    self.translate(reshape)
                deferred.clear()
            if isinstance(op, ReturnOp):
                self.outputs(list(op.operands))
            elif self.is_head_reshape(op):
                deferred.append(op)
            elif op.results and op.results[0] in self.values:
                continue  # written early (a SiLU after its gate)
            else:
                self.translate(op)
                self.pull_activation(op)
        return self.out

    def suffix(self, op: Operation) -> str:
        loc = op.attributes["loc"].data if "loc" in op.attributes else ""  # type: ignore[attr-defined]
        return loc.partition(".")[2].partition(".")[2] if self.is_block else ""

    def is_head_reshape(self, op: Operation) -> bool:
        return isinstance(op, top.ReshapeOp) and self.suffix(op) in ("q_heads", "k_heads", "v_heads")

    def part_of_projections(self, op: Operation) -> bool:
        suffix = self.suffix(op)
        return self.is_head_reshape(op) or suffix in ("q_proj", "k_proj", "v_proj") or suffix.endswith("_act_order")

    def pull_activation(self, op: Operation) -> None:
        """A projection whose one use is a SiLU: the SiLU is written right after it."""
        uses = list(op.results[0].uses) if op.results else []
        if len(uses) != 1:
            return
        user = uses[0].operation
        if isinstance(user, top.SiLUOp):
            self.translate(user)

    # -- helpers -------------------------------------------------------------------------------------
    def loc(self, op: Operation) -> str:
        loc = op.attributes["loc"].data  # type: ignore[attr-defined]
        if not self.is_block:
            return loc
        layer, _, suffix = loc.partition(".")[2].partition(".")
        suffix, act_order, _ = suffix.partition("_act_order")  # a projection's input permutation
        mapped = _LAYER_LOCS.get(suffix)
        if act_order and mapped is not None:
            mapped += ".act_order"
        if suffix == "mlp_residual" and self.final_norm is None:
            mapped = "/output_states"  # the block's result is named by the op that computes it
        if not loc.startswith("layers.") or mapped is None:
            raise self.fail(f"no vendor name for the op at {loc!r}")
        return mapped[1:] if mapped.startswith("/") else f"model.layers.{layer}.{mapped}"

    def array(self, value: SSAValue) -> tuple[str, np.ndarray]:
        name = self.array_name(value)
        return name, np.asarray(materialize(self.weights[name]))

    def operand(self, value: SSAValue) -> ir.Value:
        if value not in self.values:
            raise self.fail(f"operand of {value.owner.name} was not translated")
        return self.values[value]

    def weight_value(self, value: SSAValue, shape: tuple[int, ...] | None = None, transpose: bool = False,
                     key: str | None = None) -> ir.Value:
        name, data = self.array(value)
        if transpose:
            data = data.T
        if shape is not None:
            data = data.reshape(shape)
        return self.out.weight(key or self.weight_key(name), data)

    def table_value(self, value: SSAValue, key: str | None = None, axis: int = 0) -> list[ir.Value]:
        """A vocabulary table as the vendor reads it: in `table_storage` where the net has one (encoded by
        blocks of rows, never whole in float32), else float32; cut along `axis` into `table_parts` weights."""
        name = self.array_name(value)
        key = key or self.weight_key(name)
        stored = self.weights[name]
        data = self.array(value)[1] if self.table_storage is None else encoded(stored, self.table_storage)
        if self.table_parts == 1:
            return [self.out.weight(key, data)]
        n = data.shape[axis]
        bounds = [n * i // self.table_parts for i in range(self.table_parts + 1)]
        return [self.out.weight(f"{key}.part{i}", data[lo:hi] if axis == 0 else data[:, lo:hi])
                for i, (lo, hi) in enumerate(itertools.pairwise(bounds))]

    def joined(self, parts: list[ir.Value], shape: tuple[int, ...], axis: int, loc: str) -> ir.Value:
        """The parts' results as one (a table given in parts); a single part is itself."""
        if len(parts) == 1:
            return parts[0]
        attrs = {**ir.CONCAT, "only_merge": ir.boolean(False), "axis": ir.si32(axis)}
        return self.out.op("top.Concat", parts, shape, loc, attrs)

    def array_name(self, value: SSAValue) -> str:
        op = value.owner
        if not isinstance(op, top.WeightOp):
            raise self.fail(f"expected a weight operand, got {op.name}")
        name = op.attributes["name"].data  # type: ignore[attr-defined]
        if name not in self.weights:
            raise self.fail(f"weight {name} was not supplied")
        return name

    def weight_key(self, name: str) -> str:
        return vendor_weight_key(name)

    def leading_ones(self, value: SSAValue, rank: int) -> ir.Value:
        """A per-channel vector as the vendor declares it: [1, ..., 1, C] with the activation's rank."""
        n = common.shape_of(value)[-1]
        return self.weight_value(value, (1,) * (rank - 1) + (n,))

    # -- ops -----------------------------------------------------------------------------------------
    def translate(self, op: Operation) -> None:
        handler = getattr(self, "op_" + op.name.split(".")[1], None)
        if handler is None:
            raise self.fail(f"op {op.name} has no vendor form")
        result = handler(op)
        if result is not None:
            self.values[op.results[0]] = result

    def op_Input(self, op: top.InputOp) -> ir.Value | None:
        name = op.attributes["loc"].data  # type: ignore[attr-defined]
        if name == "attention_mask" and self.dynamic is not None and self.prefill:
            return None  # the mask is a weight of the attention (DynamicPrefill)
        name = _INPUT_NAMES.get(name, name) if self.is_block else name
        shape = common.shape_of(op.results[0])
        element = ir.F32 if "f32" in str(op.results[0].type) else ir.SI32
        return self.out.input(name, shape, element)

    def op_RMSNorm(self, op: top.RMSNormOp) -> ir.Value:
        x = op.operands[0]
        if self.net == "lm_head":
            return self.operand(x)  # the vendor's last block computes the final norm
        gamma = self.leading_ones(op.operands[1], len(common.shape_of(x)))
        attrs = {"eps": ir.f64(op.attributes["eps"].value.data), "weight_keep_f32": "false"}  # type: ignore[attr-defined]
        return self.out.op("top.RMSNorm", [self.operand(x), gamma], common.shape_of(x), self.loc(op), attrs)

    def op_MatMul(self, op: top.MatMulOp) -> ir.Value:
        x, w = op.operands[0], op.operands[1]
        bias = op.operands[2] if len(op.operands) > 2 else None
        shape = common.shape_of(op.results[0])
        if self.net == "lm_head":
            # The vendor multiplies W[V, H] by x[1, H]ᵀ and reshapes, then takes the top-1 on the chip.
            v = common.shape_of(w)[0]
            tables = self.table_value(w, key="lm_head.weight")
            attrs = {**ir.MATMUL, "right_transpose": "true"}
            x_value = self.operand(x)
            loc = "lm_head" if len(tables) == 1 else "lm_head.part{}"
            columns = [self.out.op("top.MatMul", [t, x_value, self.out.none], (t.shape[0], 1), loc.format(i), attrs)
                       for i, t in enumerate(tables)]
            column = self.joined(columns, (v, 1), 0, "lm_head")
            return self.out.op("top.Reshape", [column], (1, v), "lm_head.reshape", {"flatten_start_dim": ir.i64(-1)})
        bias_value = self.leading_ones(bias, len(shape)) if bias is not None else self.out.none
        weight = self.weight_value(w, transpose=True)
        attrs = {**ir.MATMUL, "right_transpose": "false"}
        return self.out.op("top.MatMul", [self.operand(x), weight, bias_value], shape, self.loc(op), attrs)

    def op_A16MatMul(self, op: top.A16MatMulOp) -> ir.Value:
        x, q, scales, zeros = op.operands[:4]
        bias = op.operands[4] if len(op.operands) > 4 else None
        bits = op.attributes["weight_bits"].value.data  # type: ignore[attr-defined]
        group = op.attributes["q_group_size"].value.data  # type: ignore[attr-defined]
        shape = common.shape_of(op.results[0])
        qname, levels = self.array(q)
        base = qname.removesuffix(".qweight")
        key = "lm_head" if self.net == "lm_head" else vendor_weight_key(base)
        bias_value = self.leading_ones(bias, len(shape)) if bias is not None else self.out.none
        # The vendor's A16MatMul takes the .llmb device's layout (the incumbent's format): quant/pack.py's.
        where = f"net {self.net}: {base}"
        try:
            zp = device_zero_points(self.array(zeros)[1], bits, where)
            packed = pack_levels(np.asarray(levels, np.uint8), bits, where)
        except LlmbuildError as exc:
            raise ExportError(str(exc)) from None
        qweight = self.out.weight(key + ".qweight", packed)
        scale_value = self.out.weight(key + ".scales", np.asarray(self.array(scales)[1], np.float32))
        zp_value = self.out.weight(key + ".qzeros", zp)
        attrs = {"q_group_size": ir.i64(group), "right_transpose": "true", "weight_bits": ir.i64(bits)}
        operands = [self.operand(x), qweight, scale_value, zp_value, bias_value]
        loc = "lm_head" if self.net == "lm_head" else self.loc(op)
        result = self.out.op("top.A16MatMul", operands, shape, loc, attrs)
        if self.net == "lm_head":
            return self.out.op("top.Reshape", [result], shape, "lm_head.reshape", {"flatten_start_dim": ir.i64(-1)})
        return result

    def op_Gather(self, op: top.GatherOp) -> ir.Value | None:
        table, indices = op.operands
        axis = op.attributes["axis"].value.data  # type: ignore[attr-defined]
        if isinstance(table.owner, top.WeightOp):
            name = table.owner.attributes["name"].data  # type: ignore[attr-defined]
            if name in _ROPE_KEYS:
                return self.rope_table(op, name)
            if axis == 0 and not self.is_block:  # the embedding, its table in parts by columns
                shape = common.shape_of(op.results[0])
                attrs = {**ir.GATHER, "axis": ir.si32(0)}
                ids = self.operand(indices)
                tables = self.table_value(table, axis=1)
                loc = self.net if len(tables) == 1 else self.net + ".part{}"
                rows = [self.out.op("top.Gather", [t, ids], (*shape[:-1], t.shape[1]), loc.format(i), attrs)
                        for i, t in enumerate(tables)]
                return self.joined(rows, shape, len(shape) - 1, self.net)
        if isinstance(indices.owner, top.WeightOp):  # act order: the input permuted to the levels' order
            name, perm = self.array(indices)
            index_weight = self.out.weight(vendor_weight_key(name), perm.astype(np.float32))
            shape = common.shape_of(op.results[0])
            attrs = {**ir.GATHER, "axis": ir.si32(axis)}
            return self.out.op("top.Gather", [self.operand(table), index_weight], shape, self.loc(op), attrs)
        raise self.fail(f"gather at {op.attributes['loc']} has no vendor form")

    def rope_table(self, op: top.GatherOp, name: str) -> ir.Value | None:
        """Gather(table[S, d], pos) then Reshape [1, n, 1, d] in TopOp; one Gather of [S, 1, d] here."""
        key, loc = _ROPE_KEYS[name]
        _, data = self.array(op.operands[0])
        reshape = next(iter(op.results[0].uses)).operation
        if not isinstance(reshape, top.ReshapeOp):
            raise self.fail(f"{name} rows are used by {reshape.name}, expected a Reshape to heads")
        table = self.out.weight(key, data.reshape(data.shape[0], 1, data.shape[1]))
        attrs = {**ir.GATHER, "axis": ir.si32(0)}
        shape = common.shape_of(reshape.results[0])
        value = self.out.op("top.Gather", [table, self.operand(op.operands[1])], shape, loc, attrs)
        self.values[reshape.results[0]] = value
        return None

    def op_Reshape(self, op: top.ReshapeOp) -> ir.Value | None:
        if op.results[0] in self.values:  # a RoPE table's reshape, translated with its gather
            return None
        shape = common.shape_of(op.results[0])
        attrs = {"flatten_start_dim": ir.i64(-1)}
        if self.prefill and len(shape) == 4:
            attrs["shape"] = ir.int_array((1, -1, *shape[2:]))
        return self.out.op("top.Reshape", [self.operand(op.operands[0])], shape, self.loc(op), attrs)

    def op_Rope(self, op: top.RopeOp) -> ir.Value:
        x, cos, sin = (self.operand(v) for v in op.operands)
        # The vendor's Rope takes (x, sin, cos): x * cos + rotate_half(x) * sin.
        return self.out.op("top.Rope", [x, sin, cos], common.shape_of(op.results[0]), self.loc(op), ir.ROPE)

    def op_FAttention(self, op: top.FAttentionOp) -> ir.Value:
        if self.explicit_attention:
            return self.attention_ops(op, self.operand(op.operands[3]))
        q, k, v = (self.operand(x) for x in op.operands[:3])
        a = op.attributes
        attrs = {**ir.FATTENTION, "scale": ir.f64(a["scale"].value.data)}  # type: ignore[attr-defined]
        if self.dynamic is not None and self.prefill:
            mask = self.out.weight(MASK_WEIGHT, self.dynamic.mask())
            attrs["mask_size"] = ir.si32(self.dynamic.mask_size)
        else:
            if self.dynamic is not None:
                self.out.placeholder(MASK_WEIGHT, self.dynamic.mask())
            mask = self.operand(op.operands[3])
        for key in ("batch", "dim", "kv_head", "mk", "mq", "q_head"):
            attrs[key] = ir.i64(a[key].value.data)  # type: ignore[attr-defined]
        return self.out.op("top.FAttention", [q, k, v, mask, self.out.none], common.shape_of(op.results[0]),
                           self.loc(op), attrs)

    def attention_ops(self, op: top.FAttentionOp, mask: ir.Value | None) -> ir.Value:
        """Attention as products, a softmax and permutes: the vendor's fused `FAttention` gives NaN in F32 (its
        own interpreter too: the kernel is for 16-bit types), so f32 nets spell it out. Query heads are
        grouped by the KV head they read, so one batched product per KV head serves its G query heads.
        `mask`: the additive mask, or None where every position attends to every other (a vision tower)."""
        q, k, v = (self.operand(x) for x in op.operands[:3])
        a = op.attributes
        nh, kvh, d = (a[key].value.data for key in ("q_head", "kv_head", "dim"))  # type: ignore[attr-defined]
        n, mk = a["mq"].value.data, a["mk"].value.data  # type: ignore[attr-defined]
        scale = a["scale"].value.data  # type: ignore[attr-defined]
        g = nh // kvh
        base = self.loc(op)
        out = self.out

        def permute(x: ir.Value, order: tuple[int, ...], loc: str) -> ir.Value:
            shape = tuple(x.shape[i] for i in order)
            return out.op("top.Permute", [x], shape, loc, {"order": ir.int_array(order)})

        def reshape(x: ir.Value, shape: tuple[int, ...], loc: str) -> ir.Value:
            return out.op("top.Reshape", [x], shape, loc, {"flatten_start_dim": ir.i64(-1)})

        qh = reshape(permute(q, (0, 2, 1, 3), base + ".q_heads"), (1, kvh, g * n, d), base + ".q_groups")
        kt = permute(k, (0, 2, 3, 1), base + ".k_transposed")
        vh = permute(v, (0, 2, 1, 3), base + ".v_heads")
        matmul = {**ir.MATMUL, "right_transpose": "false"}
        scores = out.op("top.MatMul", [qh, kt, out.none], (1, kvh, g * n, mk), base + ".scores", matmul)
        scores = reshape(scores, (1, nh, n, mk), base + ".scores_heads")
        scaled = out.op("top.MulConst", [scores], (1, nh, n, mk), base + ".scaled",
                        {"const_val": ir.f64(scale), **ir.ELEMENTWISE})
        if mask is not None:
            scaled = out.op("top.Add", [scaled, mask], (1, nh, n, mk), base + ".masked", ir.ELEMENTWISE)
        probs = out.op("top.Softmax", [scaled], (1, nh, n, mk), base + ".softmax",
                       {"axis": ir.si32(3), "log": "false", "beta": ir.f64(1.0)})
        probs = reshape(probs, (1, kvh, g * n, mk), base + ".probs_groups")
        ctx = out.op("top.MatMul", [probs, vh, out.none], (1, kvh, g * n, d), base + ".context", matmul)
        ctx = permute(reshape(ctx, (1, nh, n, d), base + ".context_heads"), (0, 2, 1, 3), base + ".context_rows")
        return reshape(ctx, (1, n, nh * d), base)

    def op_Concat(self, op: top.ConcatOp) -> ir.Value:
        axis = op.attributes["axis"].value.data  # type: ignore[attr-defined]
        attrs = {**self.concat_attrs, "axis": ir.si32(axis)}
        return self.out.op("top.Concat", [self.operand(v) for v in op.operands], common.shape_of(op.results[0]),
                           self.loc(op), attrs)

    def _binary(self, name: str, op: Operation) -> ir.Value:
        return self.out.op(name, [self.operand(v) for v in op.operands], common.shape_of(op.results[0]),
                           self.loc(op), ir.ELEMENTWISE)

    def op_Add(self, op: top.AddOp) -> ir.Value:
        return self._binary("top.Add", op)

    def op_Mul(self, op: top.MulOp) -> ir.Value:
        return self._binary("top.Mul", op)

    def op_SiLU(self, op: top.SiLUOp) -> ir.Value:
        return self.out.op("top.SiLU", [self.operand(op.operands[0])], common.shape_of(op.results[0]), self.loc(op))

    def op_A16Gather(self, op: top.A16GatherOp) -> ir.Value:
        q, scales, zeros, ids = op.operands
        group = op.attributes["q_group_size"].value.data  # type: ignore[attr-defined]
        qname, levels = self.array(q)
        # (level - zero) * scale in float32, by the op's specification kernel (no dequant_dtype: unrounded)
        table = dequantize_uncached({"q_group_size": group}, np.asarray(levels, np.uint8), self.array(scales)[1],
                                    self.array(zeros)[1])
        key = vendor_weight_key(qname.removesuffix(".qweight") + ".weight")
        weight = self.out.weight(key, table)
        attrs = {**ir.GATHER, "axis": ir.si32(0)}
        return self.out.op("top.Gather", [weight, self.operand(ids)], common.shape_of(op.results[0]), self.net, attrs)

    # -- outputs -------------------------------------------------------------------------------------
    def outputs(self, values: list[SSAValue]) -> None:
        outs = [self.operand(v) for v in values]
        if self.net == "lm_head" and not self.logits_only:
            self.out.output(self.out.topk_indices(outs[0], "token_value", "token_id"))
            return
        if self.is_block:
            hidden = outs[0]
            if self.final_norm is not None:
                gamma = self.out.weight("model.norm.weight",
                                        self.final_norm.gamma.reshape((1,) * (len(hidden.shape) - 1) + (-1,)))
                attrs = {"eps": ir.f64(self.final_norm.eps), "weight_keep_f32": "false"}
                hidden = self.out.op("top.RMSNorm", [hidden, gamma], hidden.shape, "output_states", attrs)
            outs[0] = hidden
        self.out.output(*outs)


__all__ = ["DynamicPrefill", "ExportError", "FinalNorm", "NetExporter", "export_net", "vendor_weight_key"]
