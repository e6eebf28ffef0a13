// The op schemas of reasonrl_fast, declared once for every device (CPU kernels live beside
// this file, CUDA kernels in csrc/kernels/). Fake implementations and autograd are registered
// from Python in reasonrl_fast/ops/.
#include <Python.h>
#include <torch/library.h>

extern "C" {
// Importing reasonrl_fast._C runs the static registrations below; the module itself is empty.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(reasonrl_fast, m) {
  // SPEC.md §1. logits [..., V] (last dim contiguous), target [...] integer.
  // Returns logprob [...], entropy [...] (empty when compute_entropy is false) and the
  // log-sum-exp [...] that the backward reuses. float32 outputs (float64 for float64 logits).
  m.def(
      "token_logprob(Tensor logits, Tensor target, float temperature, int ignore_index, "
      "bool compute_entropy) -> (Tensor, Tensor, Tensor)");
  // Gradient w.r.t. the logits, in the logits' dtype and layout.
  m.def(
      "token_logprob_backward(Tensor grad_logprob, Tensor? grad_entropy, Tensor logits, "
      "Tensor target, Tensor lse, Tensor entropy, float temperature, int ignore_index) -> Tensor");
  // Same, written over the logits' own storage (saves one [N, V] buffer).
  m.def(
      "token_logprob_backward_(Tensor grad_logprob, Tensor? grad_entropy, Tensor(a!) logits, "
      "Tensor target, Tensor lse, Tensor entropy, float temperature, int ignore_index) -> ()");

  // SPEC.md §2. rewards [B] floating, group_ids [B] integer -> float32 [B].
  m.def("group_advantage(Tensor rewards, Tensor group_ids, float eps, bool norm_by_std) -> Tensor");

  // SPEC.md §4. Returns (loss [], delta [B], is_weight [B]); is_weight = clamp(exp(sum of
  // masked log-ratios), min_is_weight, max_is_weight).
  m.def(
      "tb_loss(Tensor log_z, Tensor logprob, Tensor ref_logprob, Tensor old_logprob, "
      "Tensor reward, Tensor mask, float beta, float min_is_weight, float max_is_weight) "
      "-> (Tensor, Tensor, Tensor)");
  // Returns (grad_log_z [B], grad_logprob [B, T]) in the loss' dtype.
  m.def(
      "tb_loss_backward(Tensor grad_loss, Tensor delta, Tensor is_weight, Tensor mask) "
      "-> (Tensor, Tensor)");

  // SPEC.md §5 pooling. x [B, T, H], mask [B, T] -> [B, H] = sum_t x m / sum_t m (0 for an
  // empty mask), accumulated in float32.
  m.def("masked_mean(Tensor x, Tensor mask) -> Tensor");
  m.def("masked_mean_backward(Tensor grad, Tensor mask) -> Tensor");
}
