// Input of `canonicalize` (tests/test_passes.py compares the result with canonicalize.expected.mlir).
// - %4 is an identity reshape: removed, its readers read %3;
// - %6 undoes %5: the chain folds to an identity reshape of %3, which is removed as well;
// - %8 -> %9 -> %10: the chain folds to one reshape of %7; %8 and %9 are left dead and dropped;
// - %5 is also returned, so it survives (reading %3 directly);
// - %11 is a weight nobody reads: dropped.
"builtin.module"() ({
  "func.func"() <{sym_name = "block_0", function_type = (tensor<1x4x16xf32>) -> (tensor<1x4x16xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>)}> ({
  ^bb0(%0: tensor<1x4x16xf32>):
    %1 = "top.Input"(%0) {loc = "hidden_states"} : (tensor<1x4x16xf32>) -> tensor<1x4x16xf32>
    %2 = "top.Weight"() {name = "layers.0.input_layernorm.weight", loc = "layers.0.input_layernorm.weight"} : () -> tensor<16xf32>
    %3 = "top.RMSNorm"(%1, %2) {eps = 1.000000e-06 : f64, loc = "norm"} : (tensor<1x4x16xf32>, tensor<16xf32>) -> tensor<1x4x16xf32>
    %4 = "top.Reshape"(%3) {loc = "identity"} : (tensor<1x4x16xf32>) -> tensor<1x4x16xf32>
    %5 = "top.Reshape"(%4) {loc = "heads"} : (tensor<1x4x16xf32>) -> tensor<1x4x2x8xf32>
    %6 = "top.Reshape"(%5) {loc = "unheads"} : (tensor<1x4x2x8xf32>) -> tensor<1x4x16xf32>
    %7 = "top.Add"(%6, %1) {loc = "residual"} : (tensor<1x4x16xf32>, tensor<1x4x16xf32>) -> tensor<1x4x16xf32>
    %8 = "top.Reshape"(%7) {loc = "flat_rows"} : (tensor<1x4x16xf32>) -> tensor<4x16xf32>
    %9 = "top.Reshape"(%8) {loc = "flat"} : (tensor<4x16xf32>) -> tensor<1x64xf32>
    %10 = "top.Reshape"(%9) {loc = "residual_heads"} : (tensor<1x64xf32>) -> tensor<1x4x2x8xf32>
    %11 = "top.Weight"() {name = "layers.0.post_attention_layernorm.weight", loc = "unused"} : () -> tensor<16xf32>
    "func.return"(%7, %10, %5) : (tensor<1x4x16xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> ()
  }) {arg_names = ["hidden_states"], result_names = ["hidden_states", "residual_heads", "heads"]} : () -> ()
}) {top.net = "block_0", top.stage = "prefill", top.layer = 0 : i64} : () -> ()
