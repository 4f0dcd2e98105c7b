"builtin.module"() ({
  "func.func"() <{sym_name = "block_0", function_type = (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<1x4x16xbf16>}> ({
  ^bb0(%0: tensor<1x4x16xbf16>, %1: tensor<1x4xi32>):
    %2 = "top.Input"(%0) {loc = "hidden_states"} : (tensor<1x4x16xbf16>) -> tensor<1x4x16xbf16>
    %3 = "top.Input"(%1) {loc = "position_ids"} : (tensor<1x4xi32>) -> tensor<1x4xi32>
    %4 = "top.Weight"() {name = "rope.cos", loc = "rope.cos"} : () -> tensor<8x8xf32>
    %5 = "tpu.Gather"(%4, %3) {axis = 0 : i64, loc = "cos_gather"} : (tensor<8x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
    %6 = "tpu.Reshape"(%5) {loc = "cos_heads"} : (tensor<1x4x8xf32>) -> tensor<1x4x1x8xf32>
    %7 = "top.Weight"() {name = "rope.sin", loc = "rope.sin"} : () -> tensor<8x8xf32>
    %8 = "tpu.Gather"(%7, %3) {axis = 0 : i64, loc = "sin_gather"} : (tensor<8x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
    %9 = "tpu.Reshape"(%8) {loc = "sin_heads"} : (tensor<1x4x8xf32>) -> tensor<1x4x1x8xf32>
    %10 = "top.Weight"() {name = "layers.0.self_attn.q_proj.weight", loc = "layers.0.self_attn.q_proj.weight"} : () -> tensor<16x16xbf16>
    %11 = "tpu.MatMul"(%2, %10) {right_transpose = true, do_relu = false, loc = "q_proj"} : (tensor<1x4x16xbf16>, tensor<16x16xbf16>) -> tensor<1x4x16xbf16>
    %12 = "tpu.Reshape"(%11) {loc = "q_heads"} : (tensor<1x4x16xbf16>) -> tensor<1x4x2x8xbf16>
    %13 = "tpu.Rope"(%12, %6, %9) {loc = "q_rope"} : (tensor<1x4x2x8xbf16>, tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x2x8xbf16>
    %14 = "tpu.Reshape"(%13) {loc = "q_flat"} : (tensor<1x4x2x8xbf16>) -> tensor<1x4x16xbf16>
    %15 = "top.Weight"() {name = "layers.0.mlp.gate_proj.weight", loc = "layers.0.mlp.gate_proj.weight"} : () -> tensor<32x16xbf16>
    %16 = "tpu.MatMul"(%14, %15) {right_transpose = true, do_relu = false, loc = "gate_proj"} : (tensor<1x4x16xbf16>, tensor<32x16xbf16>) -> tensor<1x4x32xbf16>
    %17 = "tpu.Active"(%16) {loc = "gate_silu", mode = "SILU"} : (tensor<1x4x32xbf16>) -> tensor<1x4x32xbf16>
    %18 = "top.Weight"() {name = "layers.0.mlp.up_proj.weight", loc = "layers.0.mlp.up_proj.weight"} : () -> tensor<32x16xbf16>
    %19 = "tpu.MatMul"(%14, %18) {right_transpose = true, do_relu = false, loc = "up_proj"} : (tensor<1x4x16xbf16>, tensor<32x16xbf16>) -> tensor<1x4x32xbf16>
    %20 = "tpu.Mul"(%17, %19) {loc = "gate_mul"} : (tensor<1x4x32xbf16>, tensor<1x4x32xbf16>) -> tensor<1x4x32xbf16>
    %21 = "top.Weight"() {name = "layers.0.mlp.down_proj.weight", loc = "layers.0.mlp.down_proj.weight"} : () -> tensor<16x32xbf16>
    %22 = "tpu.MatMul"(%20, %21) {right_transpose = true, do_relu = false, loc = "down_proj"} : (tensor<1x4x32xbf16>, tensor<16x32xbf16>) -> tensor<1x4x16xbf16>
    %23 = "tpu.Add"(%2, %22) {loc = "mlp_residual"} : (tensor<1x4x16xbf16>, tensor<1x4x16xbf16>) -> tensor<1x4x16xbf16>
    "func.return"(%23) : (tensor<1x4x16xbf16>) -> ()
  }) {arg_names = ["hidden_states", "position_ids"], result_names = ["hidden_states"]} : () -> ()
}) {top.net = "block_0", top.stage = "prefill", top.layer = 0 : i64, tpu.mode = "bf16", tpu.chip = "bm1684x"} : () -> ()
