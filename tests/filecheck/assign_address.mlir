// Input of `assign-address` (-> assign_address.expected.mlir), with the memory plan of the filecheck
// spec in bf16 (tests/test_passes.py writes it). A cut-down decode block, already lowered to bf16:
// - inputs/outputs take their IO buffers (hidden.0 in, hidden.1 out, position_ids, present_k);
// - weights take their planned addresses; every Reshape aliases its operand's address;
// - %11's bytes are free once %13 (its last reader, through the alias %12) has run, so a later
//   activation may reuse them; values that are live at the same time never share bytes.
"builtin.module"() ({
  "func.func"() <{sym_name = "block_cache_0", function_type = (tensor<1x1x16xbf16>, tensor<1x1xi32>) -> (tensor<1x1x16xbf16>, tensor<1x1x1x8xbf16>)}> ({
  ^bb0(%0: tensor<1x1x16xbf16>, %1: tensor<1x1xi32>):
    %2 = "top.Input"(%0) {loc = "hidden_states"} : (tensor<1x1x16xbf16>) -> tensor<1x1x16xbf16>
    %3 = "top.Input"(%1) {loc = "position_ids"} : (tensor<1x1xi32>) -> tensor<1x1xi32>
    %4 = "top.Weight"() {name = "rope.cos", loc = "rope.cos"} : () -> tensor<8x8xf32>
    %5 = "tpu.Gather"(%4, %3) {axis = 0 : i64, loc = "cos_gather"} : (tensor<8x8xf32>, tensor<1x1xi32>) -> tensor<1x1x8xf32>
    %6 = "tpu.Reshape"(%5) {loc = "cos_heads"} : (tensor<1x1x8xf32>) -> tensor<1x1x1x8xf32>
    %7 = "top.Weight"() {name = "rope.sin", loc = "rope.sin"} : () -> tensor<8x8xf32>
    %8 = "tpu.Gather"(%7, %3) {axis = 0 : i64, loc = "sin_gather"} : (tensor<8x8xf32>, tensor<1x1xi32>) -> tensor<1x1x8xf32>
    %9 = "tpu.Reshape"(%8) {loc = "sin_heads"} : (tensor<1x1x8xf32>) -> tensor<1x1x1x8xf32>
    %10 = "top.Weight"() {name = "layers.0.self_attn.q_proj.weight", loc = "layers.0.self_attn.q_proj.weight"} : () -> tensor<16x16xbf16>
    %11 = "tpu.MatMul"(%2, %10) {right_transpose = true, do_relu = false, loc = "q_proj"} : (tensor<1x1x16xbf16>, tensor<16x16xbf16>) -> tensor<1x1x16xbf16>
    %12 = "tpu.Reshape"(%11) {loc = "q_heads"} : (tensor<1x1x16xbf16>) -> tensor<1x1x2x8xbf16>
    %13 = "tpu.Rope"(%12, %6, %9) {loc = "q_rope"} : (tensor<1x1x2x8xbf16>, tensor<1x1x1x8xf32>, tensor<1x1x1x8xf32>) -> tensor<1x1x2x8xbf16>
    %14 = "top.Weight"() {name = "layers.0.self_attn.k_proj.weight", loc = "layers.0.self_attn.k_proj.weight"} : () -> tensor<8x16xbf16>
    %15 = "tpu.MatMul"(%2, %14) {right_transpose = true, do_relu = false, loc = "k_proj"} : (tensor<1x1x16xbf16>, tensor<8x16xbf16>) -> tensor<1x1x8xbf16>
    %16 = "tpu.Reshape"(%15) {loc = "k_heads"} : (tensor<1x1x8xbf16>) -> tensor<1x1x1x8xbf16>
    %17 = "tpu.Rope"(%16, %6, %9) {loc = "k_rope"} : (tensor<1x1x1x8xbf16>, tensor<1x1x1x8xf32>, tensor<1x1x1x8xf32>) -> tensor<1x1x1x8xbf16>
    %18 = "tpu.Reshape"(%13) {loc = "q_flat"} : (tensor<1x1x2x8xbf16>) -> tensor<1x1x16xbf16>
    %19 = "top.Weight"() {name = "layers.0.mlp.gate_proj.weight", loc = "layers.0.mlp.gate_proj.weight"} : () -> tensor<32x16xbf16>
    %20 = "tpu.MatMul"(%18, %19) {right_transpose = true, do_relu = false, loc = "gate_proj"} : (tensor<1x1x16xbf16>, tensor<32x16xbf16>) -> tensor<1x1x32xbf16>
    %21 = "tpu.Active"(%20) {loc = "gate_silu", mode = "SILU"} : (tensor<1x1x32xbf16>) -> tensor<1x1x32xbf16>
    %22 = "top.Weight"() {name = "layers.0.mlp.up_proj.weight", loc = "layers.0.mlp.up_proj.weight"} : () -> tensor<32x16xbf16>
    %23 = "tpu.MatMul"(%18, %22) {right_transpose = true, do_relu = false, loc = "up_proj"} : (tensor<1x1x16xbf16>, tensor<32x16xbf16>) -> tensor<1x1x32xbf16>
    %24 = "tpu.Mul"(%21, %23) {loc = "gate_mul"} : (tensor<1x1x32xbf16>, tensor<1x1x32xbf16>) -> tensor<1x1x32xbf16>
    %25 = "top.Weight"() {name = "layers.0.mlp.down_proj.weight", loc = "layers.0.mlp.down_proj.weight"} : () -> tensor<16x32xbf16>
    %26 = "tpu.MatMul"(%24, %25) {right_transpose = true, do_relu = false, loc = "down_proj"} : (tensor<1x1x32xbf16>, tensor<16x32xbf16>) -> tensor<1x1x16xbf16>
    %27 = "tpu.Add"(%2, %26) {loc = "mlp_residual"} : (tensor<1x1x16xbf16>, tensor<1x1x16xbf16>) -> tensor<1x1x16xbf16>
    "func.return"(%27, %17) : (tensor<1x1x16xbf16>, tensor<1x1x1x8xbf16>) -> ()
  }) {arg_names = ["hidden_states", "position_ids"], result_names = ["hidden_states", "present_k"]} : () -> ()
}) {top.net = "block_cache_0", top.stage = "decode", top.layer = 0 : i64, tpu.mode = "bf16", tpu.chip = "bm1684x"} : () -> ()
