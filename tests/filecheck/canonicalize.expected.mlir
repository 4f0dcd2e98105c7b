"builtin.module"() ({
  "func.func"() <{sym_name = "block_0", function_type = (tensor<1x4x16xf32>) -> (tensor<1x4x16xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>)}> ({
  ^bb0(%0: tensor<1x4x16xf32>):
    %1 = "top.Input"(%0) {loc = "hidden_states"} : (tensor<1x4x16xf32>) -> tensor<1x4x16xf32>
    %2 = "top.Weight"() {name = "layers.0.input_layernorm.weight", loc = "layers.0.input_layernorm.weight"} : () -> tensor<16xf32>
    %3 = "top.RMSNorm"(%1, %2) {eps = 1.000000e-06 : f64, loc = "norm"} : (tensor<1x4x16xf32>, tensor<16xf32>) -> tensor<1x4x16xf32>
    %4 = "top.Reshape"(%3) {loc = "heads"} : (tensor<1x4x16xf32>) -> tensor<1x4x2x8xf32>
    %5 = "top.Add"(%3, %1) {loc = "residual"} : (tensor<1x4x16xf32>, tensor<1x4x16xf32>) -> tensor<1x4x16xf32>
    %6 = "top.Reshape"(%5) {loc = "residual_heads"} : (tensor<1x4x16xf32>) -> tensor<1x4x2x8xf32>
    "func.return"(%5, %6, %4) : (tensor<1x4x16xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> ()
  }) {arg_names = ["hidden_states"], result_names = ["hidden_states", "residual_heads", "heads"]} : () -> ()
}) {top.net = "block_0", top.stage = "prefill", top.layer = 0 : i64} : () -> ()
