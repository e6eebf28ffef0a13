// The op schemas of reasonrl_fast, declared once for every device (CPU kernels live beside
// this file, CUDA kernels in csrc/kernels/). Fake implementations and autograd are registered
// from Python in reasonrl_fast/ops/.
#include <Python.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "capability.h"

namespace {
// The CPU capability of the kernels' loops (capability.h), for reasonrl_fast/ops/__init__.py.
// A c10::Error (a bad name, one this CPU lacks) becomes a ValueError with its message.
template <typename F>
PyObject* guarded(F f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyObject* py_cpu_capability(PyObject*, PyObject*) {
  return guarded([] {
    return PyUnicode_FromString(reasonrl_fast::capability_name(reasonrl_fast::cpu_capability()).c_str());
  });
}

PyObject* py_cpu_capabilities(PyObject*, PyObject*) {
  return guarded([] {
    const auto names = reasonrl_fast::cpu_capabilities();
    PyObject* out = PyList_New(0);
    for (const auto& n : names) {
      PyObject* s = PyUnicode_FromString(n.c_str());
      PyList_Append(out, s);
      Py_DECREF(s);
    }
    return out;
  });
}

PyObject* py_set_cpu_capability(PyObject*, PyObject* args) {
  const char* name = nullptr;
  if (!PyArg_ParseTuple(args, "s", &name)) return nullptr;
  return guarded([name] { return PyUnicode_FromString(reasonrl_fast::set_cpu_capability(name).c_str()); });
}

PyMethodDef methods[] = {
    {"cpu_capability", py_cpu_capability, METH_NOARGS, "The CPU capability the CPU kernels run at."},
    {"cpu_capabilities", py_cpu_capabilities, METH_NOARGS, "The CPU capabilities this CPU has, narrowest first."},
    {"set_cpu_capability", py_set_cpu_capability, METH_VARARGS,
     "Force a CPU capability for this process; returns the one in force before."},
    {nullptr, nullptr, 0, nullptr}};
}  // namespace

// Importing reasonrl_fast._C runs the static registrations below; the module holds the CPU
// capability's three functions. PyMODINIT_FUNC gives the init function C linkage and default
// visibility, so the interpreter finds it even when the library is built with -fvisibility=hidden.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
  return PyModule_Create(&module_def);
}

TORCH_LIBRARY(reasonrl_fast, m) {
  // docs/math.md §Token log-prob and entropy.
  // logits [..., V] (last dim contiguous), target [...] integer.
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

  // docs/math.md §Group advantage. rewards [B] floating, group_ids [B] integer -> float32 [B].
  m.def("group_advantage(Tensor rewards, Tensor group_ids, float eps, bool norm_by_std) -> Tensor");

  // docs/math.md §FlowRL trajectory balance.
  // Returns (loss [], delta [B], is_weight [B]); is_weight = clamp(exp(sum of
  // masked log-ratios), min_is_weight, max_is_weight).
  m.def(
      "tb_loss(Tensor log_z, Tensor logprob, Tensor ref_logprob, Tensor old_logprob, "
      "Tensor reward, Tensor mask, float beta, float min_is_weight, float max_is_weight) "
      "-> (Tensor, Tensor, Tensor)");
  // Returns (grad_log_z [B], grad_logprob [B, T]) in the loss' dtype.
  m.def(
      "tb_loss_backward(Tensor grad_loss, Tensor delta, Tensor is_weight, Tensor mask) "
      "-> (Tensor, Tensor)");

  // docs/math.md §Masked mean. x [B, T, H], mask [B, T] -> [B, H] = sum_t x m / sum_t m (0 for an
  // empty mask), accumulated in float32.
  m.def("masked_mean(Tensor x, Tensor mask) -> Tensor");
  m.def("masked_mean_backward(Tensor grad, Tensor mask) -> Tensor");
}

namespace {
// token_logprob_backward_ overwrites the logits: bump their version counter, as every in-place
// aten op does, so that autograd raises on a later use of the overwritten tensor by any op that
// saved it, also when the op is called directly rather than through token_logprob(). (The
// default autograd fallback of a custom op does not bump it.) No output, so no graph to record.
void token_logprob_backward_autograd(const at::Tensor& grad_logprob,
                                     const c10::optional<at::Tensor>& grad_entropy,
                                     const at::Tensor& logits, const at::Tensor& target,
                                     const at::Tensor& lse, const at::Tensor& entropy,
                                     double temperature, int64_t ignore_index) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("reasonrl_fast::token_logprob_backward_", "")
                       .typed<void(const at::Tensor&, const c10::optional<at::Tensor>&,
                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, double, int64_t)>();
  {
    c10::impl::ExcludeDispatchKeyGuard below(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    op.call(grad_logprob, grad_entropy, logits, target, lse, entropy, temperature, ignore_index);
  }
  logits.unsafeGetTensorImpl()->bump_version();
}
}  // namespace

TORCH_LIBRARY_IMPL(reasonrl_fast, Autograd, m) {
  m.impl("token_logprob_backward_", &token_logprob_backward_autograd);
}
