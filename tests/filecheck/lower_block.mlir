// Input of `lower-top-to-tpu` (mode=bf16 -> lower_block.bf16.expected.mlir, f16 -> lower_block.f16.expected.mlir).
// A cut-down prefill block of the filecheck spec (hidden 16, 2 heads of 8, MLP 32, S=8, L=4): the RoPE
// tables and what is gathered from them must stay f32; Rope reads low-precision activations with f32
// tables; SiLU becomes tpu.Active {mode = "SILU"}; i32 positions stay i32.
"builtin.module"() ({
  "func.func"() <{sym_name = "block_0", function_type = (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<1x4x16xf32>}> ({
  ^bb0(%0: tensor<1x4x16xf32>, %1: tensor<1x4xi32>):
    %2 = "top.Input"(%0) {loc = "hidden_states"} : (tensor<1x4x16xf32>) -> tensor<1x4x16xf32>
    %3 = "top.Input"(%1) {loc = "position_ids"} : (tensor<1x4xi32>) -> tensor<1x4xi32>
    %4 = "top.Weight"() {name = "rope.cos", loc = "rope.cos"} : () -> tensor<8x8xf32>
    %5 = "top.Gather"(%4, %3) {axis = 0 : i64, loc = "cos_gather"} : (tensor<8x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
    %6 = "top.Reshape"(%5) {loc = "cos_heads"} : (tensor<1x4x8xf32>) -> tensor<1x4x1x8xf32>
    %7 = "top.Weight"() {name = "rope.sin", loc = "rope.sin"} : () -> tensor<8x8xf32>
    %8 = "top.Gather"(%7, %3) {axis = 0 : i64, loc = "sin_gather"} : (tensor<8x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
    %9 = "top.Reshape"(%8) {loc = "sin_heads"} : (tensor<1x4x8xf32>) -> tensor<1x4x1x8xf32>
    %10 = "top.Weight"() {name = "layers.0.self_attn.q_proj.weight", loc = "layers.0.self_attn.q_proj.weight"} : () -> tensor<16x16xf32>
    %11 = "top.MatMul"(%2, %10) {right_transpose = true, do_relu = false, loc = "q_proj"} : (tensor<1x4x16xf32>, tensor<16x16xf32>) -> tensor<1x4x16xf32>
    %12 = "top.Reshape"(%11) {loc = "q_heads"} : (tensor<1x4x16xf32>) -> tensor<1x4x2x8xf32>
    %13 = "top.Rope"(%12, %6, %9) {loc = "q_rope"} : (tensor<1x4x2x8xf32>, tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x2x8xf32>
    %14 = "top.Reshape"(%13) {loc = "q_flat"} : (tensor<1x4x2x8xf32>) -> tensor<1x4x16xf32>
    %15 = "top.Weight"() {name = "layers.0.mlp.gate_proj.weight", loc = "layers.0.mlp.gate_proj.weight"} : () -> tensor<32x16xf32>
    %16 = "top.MatMul"(%14, %15) {right_transpose = true, do_relu = false, loc = "gate_proj"} : (tensor<1x4x16xf32>, tensor<32x16xf32>) -> tensor<1x4x32xf32>
    %17 = "top.SiLU"(%16) {loc = "gate_silu"} : (tensor<1x4x32xf32>) -> tensor<1x4x32xf32>
    %18 = "top.Weight"() {name = "layers.0.mlp.up_proj.weight", loc = "layers.0.mlp.up_proj.weight"} : () -> tensor<32x16xf32>
    %19 = "top.MatMul"(%14, %18) {right_transpose = true, do_relu = false, loc = "up_proj"} : (tensor<1x4x16xf32>, tensor<32x16xf32>) -> tensor<1x4x32xf32>
    %20 = "top.Mul"(%17, %19) {loc = "gate_mul"} : (tensor<1x4x32xf32>, tensor<1x4x32xf32>) -> tensor<1x4x32xf32>
    %21 = "top.Weight"() {name = "layers.0.mlp.down_proj.weight", loc = "layers.0.mlp.down_proj.weight"} : () -> tensor<16x32xf32>
    %22 = "top.MatMul"(%20, %21) {right_transpose = true, do_relu = false, loc = "down_proj"} : (tensor<1x4x32xf32>, tensor<16x32xf32>) -> tensor<1x4x16xf32>
    %23 = "top.Add"(%2, %22) {loc = "mlp_residual"} : (tensor<1x4x16xf32>, tensor<1x4x16xf32>) -> tensor<1x4x16xf32>
    "func.return"(%23) : (tensor<1x4x16xf32>) -> ()
  }) {arg_names = ["hidden_states", "position_ids"], result_names = ["hidden_states"]} : () -> ()
}) {top.net = "block_0", top.stage = "prefill", top.layer = 0 : i64} : () -> ()
