"""The `top` dialect: framework- and chip-independent model semantics (TPU-MLIR's Top dialect).

Tensors are f32 (integer ids and positions are si32/i32). Weights are `top.Weight` ops naming a tensor
in the module's weight file. The compute ops are made from their definitions (`llmbuild/op_defs/`, with
each op's numpy semantics) by `from_definitions.py`.

Example (one RMSNorm):

    %1 = "top.Weight"() {name = "layers.0.input_layernorm.weight"} : () -> tensor<64xf32>
    %2 = "top.RMSNorm"(%0, %1) {eps = 1.0e-06 : f64} : (tensor<1x16x64xf32>, tensor<64xf32>) -> ...
"""

from __future__ import annotations

from xdsl.ir import Dialect
from xdsl.irdl import irdl_op_definition

from llmbuild.dialects import common, from_definitions
from llmbuild.op_defs import OPS


@irdl_op_definition
class InputOp(common.InputBase):
    name = "top.Input"


@irdl_op_definition
class WeightOp(common.WeightBase):
    name = "top.Weight"


COMPUTE = from_definitions.top_classes(OPS, __name__)
globals().update({cls.__name__: cls for cls in COMPUTE.values()})  # top.MatMulOp, top.SiLUOp, ...

Top = Dialect("top", [InputOp, WeightOp, *COMPUTE.values()], [])
