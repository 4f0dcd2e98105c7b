"""MiniCPM-V's vit net (SigLIP and the resampler: the TopOp net the vision step imports from the static ONNX
graph, model.export_onnx) printed as the vendor's top module, in the form `llm_convert`'s MiniCPM-V
converter gives its `vit` net (TPU-MLIR's MiniCPMV4Converter) and LLM-TPU's MiniCPM-V runtime fills by
position (models/MiniCPMV4/python_demo/chat.cpp's forward_vit, pipeline.py's vit_process_image):

    input_states         [N, 3 p²]      f32    a piece's patches, one row each (channel, row, column), padded
    pos_ids              [N]            si32   the tower's position ids (bucketized into its side² table)
    attn_mask            [1, 1, N, N]   f32    the tower's additive mask (padding keys masked)
    pos_embed_ids        [N]            si32   row * side + column: each patch's row in the resampler's
                                               side x side sin-cos table, a weight of the net
    resampler_attn_mask  [1, 1, Q, N]   f32    the resampler's additive mask
    -> image_tokens      [Q, hidden]           the rows the runtime copies over the `<unk>` embeddings

N is the net's capacity (vit_geometry's max_patches), side the tower's position table side
(image_size / patch: 70 for MiniCPM-V 2.6, the published resampler's own 70 x 70 table).

The TopOp net takes the same piece as the `.llmb`'s runtime computes it (inputs.slice_inputs): the pixels
as [1, 3, p, N p] and the sin-cos rows themselves. The export bridges the two at the net's edge and writes
everything between op for op (bmodel/vit_export.py): the patch rows replace the importer's reshape, permute
and reshape of the pixels into rows (the same values: the vendor's layout is those rows), and the key
positions become a gather from the table by `pos_embed_ids` (numerics/sincos.py's rows, the same bits: each
row depends on its coordinates only). Attention, the resampler's learned queries included, is written as its
products and softmax with the host's masks.

Pieces wider or taller than `side` patches have no rows in the table: the runtime refuses them
(inputs.vendor_inputs), as the vendor's runtime cannot address them either.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.dialects.func import FuncOp
from xdsl.ir import Operation

from llmbuild.bmodel import vendor_ir as ir
from llmbuild.bmodel.vit_export import VitExporter
from llmbuild.dialects import common, top
from llmbuild.families.minicpmv.family import STATIC_INPUTS, read_config, vit_geometry
from llmbuild.families.minicpmv.inputs import VENDOR_INPUTS
from llmbuild.numerics.sincos import sincos_2d

# The resampler's sin-cos table in the vendor's npz (llm_convert's key).
POS_TABLE = "resampler.pos_embed.weight"


def export_vit(module: ModuleOp, weights: Mapping[str, np.ndarray], weight_file: str,
               vlm: Path) -> ir.VendorModule:
    """`module`: the vit TopOp net; `weights`: its float32 weights by name; `vlm`: the checkpoint directory
    (config.json gives the position table's side)."""
    fn = next(op for op in module.ops if isinstance(op, FuncOp))
    return _Exporter(weights, weight_file, vit_geometry(read_config(vlm))["side"]).run(fn)


class _Exporter(VitExporter):
    def __init__(self, weights: Mapping[str, np.ndarray], weight_file: str, side: int):
        super().__init__("vit", weights, weight_file)
        self.side = side
        self.bridged: set[Operation] = set()  # the TopOp ops the inputs' bridge stands for

    def run(self, fn: FuncOp) -> ir.VendorModule:
        inputs = {op.attributes["loc"].data: op for op in fn.body.block.ops  # type: ignore[attr-defined]
                  if isinstance(op, top.InputOp)}
        if sorted(inputs) != sorted(STATIC_INPUTS):
            raise self.fail(f"inputs {sorted(inputs)}: expected MiniCPM-V's static vit net's {list(STATIC_INPUTS)}")
        pixels, positions, keys = inputs["pixel_values"], inputs["position_ids"], inputs["pos_embed"]
        flat = self.patch_rows(pixels)
        n, row = common.shape_of(flat.results[0])[1:]
        self.check_shape(positions, (1, n))
        dim = common.shape_of(keys.results[0])[-1]
        self.check_shape(keys, (1, n, dim))
        # The inputs first, in the vendor's order; then what bridges them to the TopOp net's.
        rows_name, ids_name, tower_mask, table_name, resampler_mask = VENDOR_INPUTS
        rows = self.out.input(rows_name, (n, row))
        ids = self.out.input(ids_name, (n,), ir.SI32)
        self.mask_input(inputs["attention_mask"], tower_mask)
        table_rows = self.out.input(table_name, (n,), ir.SI32)
        self.mask_input(inputs["resampler_mask"], resampler_mask)
        self.values[flat.results[0]] = self.reshape(rows, (1, n, row), f"{rows_name}.reshape")
        self.values[positions.results[0]] = self.reshape(ids, (1, n), f"{ids_name}.reshape")
        table = self.out.weight(POS_TABLE, sincos_2d(dim, self.side, self.side).reshape(self.side ** 2, dim))
        gathered = self.out.op("top.Gather", [table, table_rows], (n, dim), "resampler.pos_embed",
                               {**ir.GATHER, "axis": ir.si32(0)})
        self.values[keys.results[0]] = self.reshape(gathered, (1, n, dim), "resampler.pos_embed.reshape")
        return super().run(fn)

    def translate(self, op: Operation) -> None:
        if isinstance(op, top.InputOp) or op in self.bridged:
            return
        super().translate(op)

    def mask_input(self, op: top.InputOp, name: str) -> None:
        """An additive mask, the same array under the vendor's name."""
        self.values[op.results[0]] = self.out.input(name, common.shape_of(op.results[0]))

    def check_shape(self, op: top.InputOp, want: tuple[int, ...]) -> None:
        name, shape = op.attributes["loc"].data, common.shape_of(op.results[0])  # type: ignore[attr-defined]
        if shape != want:
            raise self.fail(f"input {name} {list(shape)}: expected {list(want)}")

    def only_user(self, op: Operation, kind: type, what: str) -> Operation:
        uses = list(op.results[0].uses)
        if len(uses) != 1 or not isinstance(uses[0].operation, kind):
            raise self.fail(f"pixel_values: expected {what} as the only use of {op.name}")
        return uses[0].operation

    def patch_rows(self, pixels: top.InputOp) -> Operation:
        """[1, 3, p, N p] -> reshape [1, 3, 1, p, N, p] -> permute (0, 2, 4, 1, 3, 5) -> reshape [1, N, 3 p²] in
        the TopOp net (the importer's patch product): the vendor's input is those rows. Returns the last
        reshape, whose result the input stands for."""
        b, c, p, width = common.shape_of(pixels.results[0])
        n = width // p
        grid = self.only_user(pixels, top.ReshapeOp, "the patch grid's reshape")
        perm = self.only_user(grid, top.PermuteOp, "the patches' permute")
        flat = self.only_user(perm, top.ReshapeOp, "the patch rows' reshape")
        order = tuple(perm.order.get_values())  # type: ignore[attr-defined]
        shapes = (common.shape_of(grid.results[0]), order, common.shape_of(flat.results[0]))
        if (b, width) != (1, n * p) or shapes != ((1, c, 1, p, n, p), (0, 2, 4, 1, 3, 5), (1, n, c * p * p)):
            raise self.fail(f"pixel_values {[b, c, p, width]}: expected the patch rows of one row of {n} patches "
                            f"(reshape, permute, reshape), got {shapes}")
        self.bridged |= {grid, perm, flat}
        return flat

    def reshape(self, value: ir.Value, shape: tuple[int, ...], loc: str) -> ir.Value:
        return self.out.op("top.Reshape", [value], shape, loc, {"flatten_start_dim": ir.i64(-1)})


__all__ = ["POS_TABLE", "export_vit"]
