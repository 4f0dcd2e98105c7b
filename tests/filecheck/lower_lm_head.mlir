// Input of `lower-top-to-tpu{mode=bf16}` (-> lower_lm_head.bf16.expected.mlir): the importer's lm_head
// of the filecheck spec. The `logits` result must stay f32 while everything before it is bf16.
"builtin.module"() ({
  "func.func"() <{sym_name = "lm_head", function_type = (tensor<1x16xf32>) -> tensor<1x64xf32>}> ({
  ^bb0(%0: tensor<1x16xf32>):
    %1 = "top.Input"(%0) {loc = "hidden_states"} : (tensor<1x16xf32>) -> tensor<1x16xf32>
    %2 = "top.Weight"() {name = "norm.weight", loc = "norm.weight"} : () -> tensor<16xf32>
    %3 = "top.RMSNorm"(%1, %2) {eps = 1.000000e-06 : f64, loc = "final_norm"} : (tensor<1x16xf32>, tensor<16xf32>) -> tensor<1x16xf32>
    %4 = "top.Weight"() {name = "lm_head.weight", loc = "lm_head.weight"} : () -> tensor<64x16xf32>
    %5 = "top.MatMul"(%3, %4) {right_transpose = true, do_relu = false, loc = "lm_head"} : (tensor<1x16xf32>, tensor<64x16xf32>) -> tensor<1x64xf32>
    "func.return"(%5) : (tensor<1x64xf32>) -> ()
  }) {arg_names = ["hidden_states"], result_names = ["logits"]} : () -> ()
}) {top.net = "lm_head", top.stage = "head", top.layer = -1 : i64} : () -> ()
