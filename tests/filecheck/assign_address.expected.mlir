"builtin.module"() ({
  "func.func"() <{sym_name = "block_cache_0", function_type = (tensor<1x1x16xbf16, 65600 : i64>, tensor<1x1xi32, 65856 : i64>) -> (tensor<1x1x16xbf16, 65728 : i64>, tensor<1x1x1x8xbf16, 66048 : i64>)}> ({
  ^bb0(%0: tensor<1x1x16xbf16, 65600 : i64>, %1: tensor<1x1xi32, 65856 : i64>):
    %2 = "top.Input"(%0) {loc = "hidden_states"} : (tensor<1x1x16xbf16, 65600 : i64>) -> tensor<1x1x16xbf16, 65600 : i64>
    %3 = "top.Input"(%1) {loc = "position_ids"} : (tensor<1x1xi32, 65856 : i64>) -> tensor<1x1xi32, 65856 : i64>
    %4 = "top.Weight"() {name = "rope.cos", loc = "rope.cos"} : () -> tensor<8x8xf32, 0 : i64>
    %5 = "tpu.Gather"(%4, %3) {axis = 0 : i64, loc = "cos_gather"} : (tensor<8x8xf32, 0 : i64>, tensor<1x1xi32, 65856 : i64>) -> tensor<1x1x8xf32, 69632 : i64>
    %6 = "tpu.Reshape"(%5) {loc = "cos_heads"} : (tensor<1x1x8xf32, 69632 : i64>) -> tensor<1x1x1x8xf32, 69632 : i64>
    %7 = "top.Weight"() {name = "rope.sin", loc = "rope.sin"} : () -> tensor<8x8xf32, 4096 : i64>
    %8 = "tpu.Gather"(%7, %3) {axis = 0 : i64, loc = "sin_gather"} : (tensor<8x8xf32, 4096 : i64>, tensor<1x1xi32, 65856 : i64>) -> tensor<1x1x8xf32, 69696 : i64>
    %9 = "tpu.Reshape"(%8) {loc = "sin_heads"} : (tensor<1x1x8xf32, 69696 : i64>) -> tensor<1x1x1x8xf32, 69696 : i64>
    %10 = "top.Weight"() {name = "layers.0.self_attn.q_proj.weight", loc = "layers.0.self_attn.q_proj.weight"} : () -> tensor<16x16xbf16, 16384 : i64>
    %11 = "tpu.MatMul"(%2, %10) {right_transpose = true, do_relu = false, loc = "q_proj"} : (tensor<1x1x16xbf16, 65600 : i64>, tensor<16x16xbf16, 16384 : i64>) -> tensor<1x1x16xbf16, 69760 : i64>
    %12 = "tpu.Reshape"(%11) {loc = "q_heads"} : (tensor<1x1x16xbf16, 69760 : i64>) -> tensor<1x1x2x8xbf16, 69760 : i64>
    %13 = "tpu.Rope"(%12, %6, %9) {loc = "q_rope"} : (tensor<1x1x2x8xbf16, 69760 : i64>, tensor<1x1x1x8xf32, 69632 : i64>, tensor<1x1x1x8xf32, 69696 : i64>) -> tensor<1x1x2x8xbf16, 69824 : i64>
    %14 = "top.Weight"() {name = "layers.0.self_attn.k_proj.weight", loc = "layers.0.self_attn.k_proj.weight"} : () -> tensor<8x16xbf16, 20480 : i64>
    %15 = "tpu.MatMul"(%2, %14) {right_transpose = true, do_relu = false, loc = "k_proj"} : (tensor<1x1x16xbf16, 65600 : i64>, tensor<8x16xbf16, 20480 : i64>) -> tensor<1x1x8xbf16, 69760 : i64>
    %16 = "tpu.Reshape"(%15) {loc = "k_heads"} : (tensor<1x1x8xbf16, 69760 : i64>) -> tensor<1x1x1x8xbf16, 69760 : i64>
    %17 = "tpu.Rope"(%16, %6, %9) {loc = "k_rope"} : (tensor<1x1x1x8xbf16, 69760 : i64>, tensor<1x1x1x8xf32, 69632 : i64>, tensor<1x1x1x8xf32, 69696 : i64>) -> tensor<1x1x1x8xbf16, 66048 : i64>
    %18 = "tpu.Reshape"(%13) {loc = "q_flat"} : (tensor<1x1x2x8xbf16, 69824 : i64>) -> tensor<1x1x16xbf16, 69824 : i64>
    %19 = "top.Weight"() {name = "layers.0.mlp.gate_proj.weight", loc = "layers.0.mlp.gate_proj.weight"} : () -> tensor<32x16xbf16, 36864 : i64>
    %20 = "tpu.MatMul"(%18, %19) {right_transpose = true, do_relu = false, loc = "gate_proj"} : (tensor<1x1x16xbf16, 69824 : i64>, tensor<32x16xbf16, 36864 : i64>) -> tensor<1x1x32xbf16, 69632 : i64>
    %21 = "tpu.Active"(%20) {loc = "gate_silu", mode = "SILU"} : (tensor<1x1x32xbf16, 69632 : i64>) -> tensor<1x1x32xbf16, 69696 : i64>
    %22 = "top.Weight"() {name = "layers.0.mlp.up_proj.weight", loc = "layers.0.mlp.up_proj.weight"} : () -> tensor<32x16xbf16, 40960 : i64>
    %23 = "tpu.MatMul"(%18, %22) {right_transpose = true, do_relu = false, loc = "up_proj"} : (tensor<1x1x16xbf16, 69824 : i64>, tensor<32x16xbf16, 40960 : i64>) -> tensor<1x1x32xbf16, 69632 : i64>
    %24 = "tpu.Mul"(%21, %23) {loc = "gate_mul"} : (tensor<1x1x32xbf16, 69696 : i64>, tensor<1x1x32xbf16, 69632 : i64>) -> tensor<1x1x32xbf16, 69760 : i64>
    %25 = "top.Weight"() {name = "layers.0.mlp.down_proj.weight", loc = "layers.0.mlp.down_proj.weight"} : () -> tensor<16x32xbf16, 45056 : i64>
    %26 = "tpu.MatMul"(%24, %25) {right_transpose = true, do_relu = false, loc = "down_proj"} : (tensor<1x1x32xbf16, 69760 : i64>, tensor<16x32xbf16, 45056 : i64>) -> tensor<1x1x16xbf16, 69632 : i64>
    %27 = "tpu.Add"(%2, %26) {loc = "mlp_residual"} : (tensor<1x1x16xbf16, 65600 : i64>, tensor<1x1x16xbf16, 69632 : i64>) -> tensor<1x1x16xbf16, 65728 : i64>
    "func.return"(%27, %17) : (tensor<1x1x16xbf16, 65728 : i64>, tensor<1x1x1x8xbf16, 66048 : i64>) -> ()
  }) {arg_names = ["hidden_states", "position_ids"], result_names = ["hidden_states", "present_k"]} : () -> ()
}) {top.net = "block_cache_0", top.stage = "decode", top.layer = 0 : i64, tpu.mode = "bf16", tpu.chip = "bm1684x", tpu.activation_bytes = 256 : i64} : () -> ()
