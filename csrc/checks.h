// Input validation, the backward's input preparation and the backward's entry points, shared by
// the CPU (csrc/*.cpp) and CUDA (csrc/kernels/*.cu) kernels, so both devices reject the same
// inputs with the same messages. Shape, dtype and device checks only; data checks (target ids in
// range) are the kernels' own, since they need the data.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

namespace reasonrl_fast {

inline bool is_integer_dtype(const at::Tensor& t) {
  return !at::isFloatingType(t.scalar_type()) && !t.is_complex() && t.scalar_type() != at::kBool;
}

// The accumulation (and output) dtype of token_logprob for these logits.
inline at::ScalarType logprob_acc_dtype(const at::Tensor& logits) {
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

inline void check_token_logprob(const at::Tensor& logits, const at::Tensor& target,
                                double temperature) {
  TORCH_CHECK_VALUE(logits.dim() >= 1, "token_logprob: logits must have a vocabulary dimension");
  TORCH_CHECK_TYPE(at::isFloatingType(logits.scalar_type()),
                   "token_logprob: logits must be floating point, got ", logits.scalar_type());
  TORCH_CHECK_TYPE(is_integer_dtype(target),
                   "token_logprob: target ids must be an integer tensor, got ", target.scalar_type());
  TORCH_CHECK_VALUE(target.sizes() == logits.sizes().slice(0, logits.dim() - 1),
                    "token_logprob: target shape ", target.sizes(),
                    " must equal the logits shape without its last dimension ", logits.sizes());
  TORCH_CHECK_VALUE(temperature > 0 && std::isfinite(temperature),
                    "token_logprob: temperature must be a positive finite number, got ", temperature);
  // The kernels multiply by 1/temperature in the accumulation dtype: it must not overflow there
  // (it would turn every logit into +-inf and every output into NaN). Down to the smallest
  // normal number, 1/temperature is finite (about max/4).
  const bool f64 = logprob_acc_dtype(logits) == at::kDouble;
  const double min_t = f64 ? std::numeric_limits<double>::min()
                           : static_cast<double>(std::numeric_limits<float>::min());
  TORCH_CHECK_VALUE(temperature >= min_t, "token_logprob: temperature ", temperature,
                    " is below ", min_t, ", the smallest that ", f64 ? "float64" : "float32",
                    " accumulation supports (1/temperature overflows)");
  TORCH_CHECK_VALUE(logits.size(-1) > 0 || target.numel() == 0,
                    "token_logprob: the vocabulary dimension is empty");
  TORCH_CHECK_VALUE(target.device() == logits.device(),
                    "token_logprob: target and logits must be on one device, got target on ",
                    target.device(), " and logits on ", logits.device());
}

// token_logprob_backward's arguments: those of the forward, plus grad_logprob, lse (and, when
// an entropy gradient flows, grad_entropy and entropy) of the target's shape, on its device,
// lse and entropy in the accumulation dtype, as the forward returned them. Without an entropy
// gradient, `entropy` is not read and may be the forward's empty placeholder.
inline void check_token_logprob_backward(const at::Tensor& grad_logprob,
                                         const c10::optional<at::Tensor>& grad_entropy,
                                         const at::Tensor& logits, const at::Tensor& target,
                                         const at::Tensor& lse, const at::Tensor& entropy,
                                         double temperature) {
  check_token_logprob(logits, target, temperature);
  const bool has_ent = grad_entropy.has_value() && grad_entropy->defined();
  const auto acc = logprob_acc_dtype(logits);
  auto check_like_target = [&](const at::Tensor& t, const char* name, bool exact_dtype) {
    TORCH_CHECK_VALUE(t.sizes() == target.sizes(), "token_logprob_backward: ", name,
                      " must have the target's shape ", target.sizes(), ", got ", t.sizes());
    TORCH_CHECK_VALUE(t.device() == logits.device(), "token_logprob_backward: ", name,
                      " must be on the logits' device ", logits.device(), ", got ", t.device());
    if (exact_dtype) {
      TORCH_CHECK_TYPE(t.scalar_type() == acc, "token_logprob_backward: ", name, " must be ",
                       acc, " (as the forward returns it for ", logits.scalar_type(),
                       " logits), got ", t.scalar_type());
    } else {
      TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), "token_logprob_backward: ", name,
                       " must be floating point, got ", t.scalar_type());
    }
  };
  check_like_target(grad_logprob, "grad_logprob", false);
  check_like_target(lse, "lse", true);
  if (has_ent) {
    check_like_target(*grad_entropy, "grad_entropy", false);
    check_like_target(entropy, "entropy (needed by an entropy gradient)", true);
  } else {
    TORCH_CHECK_VALUE(entropy.device() == logits.device(), "token_logprob_backward: entropy "
                      "must be on the logits' device ", logits.device(), ", got ", entropy.device());
  }
}

// token_logprob_backward_ also writes the gradient over the logits: each element must be its
// own memory (an expand()ed or otherwise self-overlapping tensor would have several rows
// write one place). Proven by the usual sufficient rule: with the dimensions ordered by
// stride, each stride is at least the span of the smaller ones.
inline void check_logits_writable(const at::Tensor& logits) {
  TORCH_CHECK_VALUE(logits.stride(-1) == 1 || logits.size(-1) <= 1,
                    "token_logprob: inplace_backward needs logits whose last dimension is contiguous");
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (int64_t d = 0; d < logits.dim(); ++d)
    if (logits.size(d) > 1) dims.emplace_back(logits.stride(d), logits.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;
  for (const auto& [stride, size] : dims) {
    TORCH_CHECK_VALUE(logits.numel() == 0 || stride >= span,
                      "token_logprob: inplace_backward needs logits whose elements do not share "
                      "memory (shape ", logits.sizes(), ", strides ", logits.strides(),
                      "); pass a contiguous copy or use inplace_backward=False");
    span += (size - 1) * stride;
  }
}

// Target ids as contiguous int64. A plain cast would wrap uint64 ids above the int64 range to
// negative numbers (possibly to ignore_index): they become INT64_MAX instead (INT64_MAX - 1 if
// that is ignore_index), outside every vocabulary, so the kernels' range check reports them.
// Done on the device, without a synchronisation.
inline at::Tensor target_as_long(const at::Tensor& target, int64_t ignore_index) {
  if (target.scalar_type() != at::kUInt64) return target.to(at::kLong).contiguous();
  const at::Tensor t = target.contiguous().view(at::kLong);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return at::where(t < 0, at::scalar_tensor(ignore_index == kMax ? kMax - 1 : kMax, t.options()), t);
}

// The logits as the kernels read them: a strided view is kept (no copy of [N, V]) unless the
// vocabulary dimension itself is strided.
inline at::Tensor rows_view(const at::Tensor& logits) {
  return logits.stride(-1) == 1 || logits.size(-1) <= 1 ? logits : logits.contiguous();
}

// token_logprob's tensors as a device's forward kernel takes them: the logits as a rows_view, the
// target ids as int64 (`target_arg` is the target as passed: its dtype matters to the range
// check), and the outputs, allocated: log-prob, entropy (an empty placeholder without
// compute_entropy) and lse, of the target's shape in the accumulation dtype.
struct LogprobForwardTensors {
  at::Tensor target_arg, logits, target, logprob, entropy, lse;
};

// A device's token_logprob forward: fills io's outputs. It runs on the logits' device (a CUDA one
// sets its own device guard) and checks the target ids.
using LogprobForwardInto = void (*)(const LogprobForwardTensors& io, double temperature,
                                    int64_t ignore_index, bool compute_entropy);

// The token_logprob op around a device's kernel: one definition for every device, so that both
// check, view and allocate alike (the backward relies on the outputs' dtypes and placeholder).
template <LogprobForwardInto forward_into>
std::tuple<at::Tensor, at::Tensor, at::Tensor> token_logprob_op(const at::Tensor& logits_in,
                                                                const at::Tensor& target_in,
                                                                double temperature,
                                                                int64_t ignore_index,
                                                                bool compute_entropy) {
  check_token_logprob(logits_in, target_in, temperature);
  const at::Tensor logits = rows_view(logits_in);
  const at::Tensor target = target_as_long(target_in, ignore_index);
  const auto opts = target.options().dtype(logprob_acc_dtype(logits));
  const LogprobForwardTensors io{
      target_in, logits, target, at::empty(target.sizes(), opts),
      compute_entropy ? at::empty(target.sizes(), opts) : at::empty({0}, opts),
      at::empty(target.sizes(), opts)};
  forward_into(io, temperature, ignore_index, compute_entropy);
  return {io.logprob, io.entropy, io.lse};
}

// token_logprob's backward inputs, checked (check_token_logprob_backward), contiguous and in the
// accumulation dtype. grad_entropy and entropy stay undefined when no entropy gradient flows.
// Target ids are not range-checked here: the kernels do that.
struct LogprobBackwardInputs {
  at::Tensor target_arg;  // the target as passed (its dtype matters to the range check)
  at::Tensor target, grad_logprob, grad_entropy, lse, entropy;
  bool has_entropy;
};

inline LogprobBackwardInputs prepare_logprob_backward(const at::Tensor& grad_logprob,
                                                      const c10::optional<at::Tensor>& grad_entropy,
                                                      const at::Tensor& logits,
                                                      const at::Tensor& target,
                                                      const at::Tensor& lse,
                                                      const at::Tensor& entropy,
                                                      double temperature, int64_t ignore_index) {
  check_token_logprob_backward(grad_logprob, grad_entropy, logits, target, lse, entropy,
                               temperature);
  const bool has_ent = grad_entropy.has_value() && grad_entropy->defined();
  const auto acc = lse.scalar_type();
  return {target,
          target_as_long(target, ignore_index),
          grad_logprob.to(acc).contiguous(),
          has_ent ? grad_entropy->to(acc).contiguous() : at::Tensor(),
          lse.contiguous(),
          has_ent ? entropy.contiguous() : at::Tensor(),
          has_ent};
}

// A device's token_logprob backward: writes the gradient of `logits` (a rows_view) into `out`,
// which is either a fresh contiguous tensor of logits' shape or `logits` itself. It runs on
// logits' device (a CUDA one sets its own device guard) and checks the target ids.
using LogprobBackwardInto = void (*)(const LogprobBackwardInputs& in, const at::Tensor& logits,
                                     const at::Tensor& out, double temperature,
                                     int64_t ignore_index);

// The two backward ops around a device's kernel, one definition for every device so that they
// check, view and allocate alike: token_logprob_backward returns a fresh gradient...
template <LogprobBackwardInto backward_into>
at::Tensor token_logprob_backward_op(const at::Tensor& grad_lp,
                                     const c10::optional<at::Tensor>& grad_ent,
                                     const at::Tensor& logits_in, const at::Tensor& target,
                                     const at::Tensor& lse, const at::Tensor& ent,
                                     double temperature, int64_t ignore_index) {
  const auto in = prepare_logprob_backward(grad_lp, grad_ent, logits_in, target, lse, ent,
                                           temperature, ignore_index);
  const at::Tensor logits = rows_view(logits_in);
  at::Tensor out = at::empty_like(logits, at::MemoryFormat::Contiguous);
  backward_into(in, logits, out, temperature, ignore_index);
  return out;
}

// ...and token_logprob_backward_ writes it over the logits.
template <LogprobBackwardInto backward_into>
void token_logprob_backward_inplace_op(const at::Tensor& grad_lp,
                                       const c10::optional<at::Tensor>& grad_ent,
                                       const at::Tensor& logits, const at::Tensor& target,
                                       const at::Tensor& lse, const at::Tensor& ent,
                                       double temperature, int64_t ignore_index) {
  const auto in = prepare_logprob_backward(grad_lp, grad_ent, logits, target, lse, ent,
                                           temperature, ignore_index);
  check_logits_writable(logits);
  // Each element is read before it is overwritten, so reading and writing the same row is safe.
  backward_into(in, logits, logits, temperature, ignore_index);
}

// The floating dtypes the kernels are instantiated for (at::isFloatingType also admits float8).
inline bool is_kernel_float(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return s == at::kDouble || s == at::kFloat || s == at::kHalf || s == at::kBFloat16;
}

// A mask (bool, integer or floating weights) is converted to the compute dtype; complex
// values have no meaning as weights.
inline void check_mask_dtype(const at::Tensor& mask, const char* op) {
  TORCH_CHECK_TYPE(!mask.is_complex(), op,
                   ": the mask must be bool, integer or floating point, got ", mask.scalar_type());
}

// group_advantage's kernels read rewards and group ids as 1-D vectors of one common length B.
inline void check_group_advantage(const at::Tensor& rewards, const at::Tensor& group_ids,
                                  double eps) {
  TORCH_CHECK_VALUE(rewards.dim() == 1, "group_advantage: rewards must be 1-D [B], got shape ",
                    rewards.sizes());
  TORCH_CHECK_VALUE(group_ids.dim() == 1 && group_ids.size(0) == rewards.size(0),
                    "group_advantage: group_ids must be 1-D [B] with one id per reward (B = ",
                    rewards.size(0), "), got shape ", group_ids.sizes());
  TORCH_CHECK_TYPE(is_kernel_float(rewards),
                   "group_advantage: rewards must be floating point (float64, float32, float16 or "
                   "bfloat16), got ", rewards.scalar_type());
  TORCH_CHECK_TYPE(is_integer_dtype(group_ids),
                   "group_advantage: group_ids must be an integer tensor, got ",
                   group_ids.scalar_type());
  TORCH_CHECK_VALUE(eps >= 0, "group_advantage: eps must be >= 0, got ", eps);
  TORCH_CHECK_VALUE(group_ids.device() == rewards.device(), "group_advantage: group_ids are on ",
                    group_ids.device(), " but rewards on ", rewards.device());
}

inline void check_tb_loss(const at::Tensor& log_z, const at::Tensor& logprob,
                          const at::Tensor& ref_logprob, const at::Tensor& old_logprob,
                          const at::Tensor& reward, const at::Tensor& mask, double min_w,
                          double max_w) {
  TORCH_CHECK_VALUE(logprob.dim() == 2, "tb_loss: logprob must be [B, T], got shape ",
                    logprob.sizes());
  for (const auto& [t, name] : {std::pair{&ref_logprob, "ref_logprob"},
                                std::pair{&old_logprob, "old_logprob"},
                                std::pair{&mask, "response_mask"}}) {
    TORCH_CHECK_VALUE(t->sizes() == logprob.sizes(), "tb_loss: ", name, " must have shape ",
                      logprob.sizes(), " like logprob, got ", t->sizes());
  }
  const int64_t B = logprob.size(0);
  for (const auto& [t, name] : {std::pair{&log_z, "log_z"}, std::pair{&reward, "reward"}}) {
    TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == B, "tb_loss: ", name, " must be [B] = [", B,
                      "], got shape ", t->sizes());
  }
  for (const auto& [t, name] : {std::pair{&log_z, "log_z"}, std::pair{&logprob, "logprob"},
                                std::pair{&ref_logprob, "ref_logprob"},
                                std::pair{&old_logprob, "old_logprob"},
                                std::pair{&reward, "reward"}}) {
    TORCH_CHECK_TYPE(at::isFloatingType(t->scalar_type()), "tb_loss: ", name,
                     " must be floating point, got ", t->scalar_type());
  }
  check_mask_dtype(mask, "tb_loss");
  TORCH_CHECK_VALUE(min_w <= max_w, "tb_loss: min_is_weight ", min_w, " > max_is_weight ", max_w);
  for (const auto* t : {&log_z, &ref_logprob, &old_logprob, &reward, &mask}) {
    TORCH_CHECK_VALUE(t->device() == logprob.device(),
                      "tb_loss: all inputs must be on one device, got ", t->device(), " and ",
                      logprob.device());
  }
}

// tb_loss's inputs in the compute dtype (float32; float64 for float64 logprob), contiguous,
// and its outputs allocated (loss [], delta [B], is_weight [B]); an empty batch's loss is NaN,
// as torch.mean's. Call after check_tb_loss.
struct TbLossTensors {
  at::Tensor log_z, logprob, ref_logprob, old_logprob, reward, mask, loss, delta, weight;
};

inline TbLossTensors prepare_tb_loss(const at::Tensor& log_z, const at::Tensor& logprob,
                                     const at::Tensor& ref_logprob, const at::Tensor& old_logprob,
                                     const at::Tensor& reward, const at::Tensor& mask) {
  const auto dt = logprob.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto prep = [&](const at::Tensor& t) { return t.to(dt).contiguous(); };
  const auto opts = logprob.options().dtype(dt);
  const int64_t B = logprob.size(0);
  TbLossTensors io{prep(log_z), prep(logprob), prep(ref_logprob), prep(old_logprob), prep(reward),
                   prep(mask), at::empty({}, opts), at::empty({B}, opts), at::empty({B}, opts)};
  if (B == 0) io.loss.fill_(std::numeric_limits<double>::quiet_NaN());
  return io;
}

// A device's tb_loss forward: fills io's loss, delta and is_weight for a batch of B > 0 (an empty
// one never reaches it). It runs on the inputs' device (a CUDA one sets its own device guard).
using TbLossInto = void (*)(const TbLossTensors& io, double beta, double min_w, double max_w);

// The tb_loss op around a device's kernel, one definition for every device.
template <TbLossInto tb_loss_into>
std::tuple<at::Tensor, at::Tensor, at::Tensor> tb_loss_op(
    const at::Tensor& log_z, const at::Tensor& logprob, const at::Tensor& ref_logprob,
    const at::Tensor& old_logprob, const at::Tensor& reward, const at::Tensor& mask, double beta,
    double min_w, double max_w) {
  check_tb_loss(log_z, logprob, ref_logprob, old_logprob, reward, mask, min_w, max_w);
  const TbLossTensors io = prepare_tb_loss(log_z, logprob, ref_logprob, old_logprob, reward, mask);
  if (io.logprob.size(0) > 0) tb_loss_into(io, beta, min_w, max_w);
  return {io.loss, io.delta, io.weight};
}

// tb_loss_backward reads grad_loss (a scalar), delta and is_weight ([B], the forward's outputs)
// and the mask [B, T]; the gradients come out in delta's dtype.
inline void check_tb_loss_backward(const at::Tensor& grad_loss, const at::Tensor& delta,
                                   const at::Tensor& w, const at::Tensor& mask) {
  TORCH_CHECK_VALUE(grad_loss.dim() == 0, "tb_loss_backward: grad_loss must be a scalar, got shape ",
                    grad_loss.sizes());
  TORCH_CHECK_VALUE(delta.dim() == 1, "tb_loss_backward: delta must be [B], got shape ",
                    delta.sizes());
  const int64_t B = delta.size(0);
  TORCH_CHECK_VALUE(w.dim() == 1 && w.size(0) == B, "tb_loss_backward: is_weight must be [B] = [",
                    B, "] like delta, got shape ", w.sizes());
  TORCH_CHECK_VALUE(mask.dim() == 2 && mask.size(0) == B,
                    "tb_loss_backward: mask must be [B, T] with B = ", B, " like delta, got shape ",
                    mask.sizes());
  TORCH_CHECK_TYPE(delta.scalar_type() == at::kFloat || delta.scalar_type() == at::kDouble,
                   "tb_loss_backward: delta must be float32 or float64 (the forward's output), got ",
                   delta.scalar_type());
  for (const auto& [t, name] : {std::pair{&grad_loss, "grad_loss"}, std::pair{&w, "is_weight"}}) {
    TORCH_CHECK_TYPE(at::isFloatingType(t->scalar_type()), "tb_loss_backward: ", name,
                     " must be floating point, got ", t->scalar_type());
  }
  check_mask_dtype(mask, "tb_loss_backward");
  for (const auto* t : {&grad_loss, &w, &mask}) {
    TORCH_CHECK_VALUE(t->device() == delta.device(),
                      "tb_loss_backward: all inputs must be on one device, got ", t->device(),
                      " and ", delta.device());
  }
}

// tb_loss_backward's inputs in delta's dtype, contiguous (grad_loss as a [1] vector), and its
// outputs allocated (grad_log_z [B], grad_logprob [B, T]). Call after check_tb_loss_backward.
struct TbLossBackwardTensors {
  at::Tensor grad_loss, delta, weight, mask, grad_log_z, grad_logprob;
};

inline TbLossBackwardTensors prepare_tb_loss_backward(const at::Tensor& grad_loss,
                                                      const at::Tensor& delta,
                                                      const at::Tensor& w,
                                                      const at::Tensor& mask) {
  const auto dt = delta.scalar_type();
  auto prep = [&](const at::Tensor& t) { return t.to(dt).contiguous(); };
  return {prep(grad_loss).reshape({1}), delta.contiguous(), prep(w), prep(mask),
          at::empty({mask.size(0)}, delta.options()), at::empty(mask.sizes(), delta.options())};
}

// A device's tb_loss backward: fills io's gradients for a batch of B > 0, on the inputs' device.
using TbLossBackwardInto = void (*)(const TbLossBackwardTensors& io);

// The tb_loss_backward op around a device's kernel, one definition for every device.
template <TbLossBackwardInto tb_loss_backward_into>
std::tuple<at::Tensor, at::Tensor> tb_loss_backward_op(const at::Tensor& grad_loss,
                                                       const at::Tensor& delta,
                                                       const at::Tensor& w, const at::Tensor& mask) {
  check_tb_loss_backward(grad_loss, delta, w, mask);
  const TbLossBackwardTensors io = prepare_tb_loss_backward(grad_loss, delta, w, mask);
  if (io.mask.size(0) > 0) tb_loss_backward_into(io);
  return {io.grad_log_z, io.grad_logprob};
}

inline void check_masked_mean(const at::Tensor& x, const at::Tensor& mask) {
  TORCH_CHECK_VALUE(x.dim() == 3, "masked_mean: hidden states must be [B, T, H], got shape ",
                    x.sizes());
  TORCH_CHECK_VALUE(mask.dim() == 2 && mask.size(0) == x.size(0) && mask.size(1) == x.size(1),
                    "masked_mean: mask must be [B, T] = [", x.size(0), ", ", x.size(1),
                    "], got shape ", mask.sizes());
  TORCH_CHECK_TYPE(is_kernel_float(x),
                   "masked_mean: hidden states must be floating point (float64, float32, float16 "
                   "or bfloat16), got ", x.scalar_type());
  check_mask_dtype(mask, "masked_mean");
  TORCH_CHECK_VALUE(mask.device() == x.device(), "masked_mean: mask is on ", mask.device(),
                    " but hidden states on ", x.device());
}

// The backward reads grad [B, H] and mask [B, T] and writes [B, T, H].
inline void check_masked_mean_backward(const at::Tensor& grad, const at::Tensor& mask) {
  TORCH_CHECK_VALUE(grad.dim() == 2, "masked_mean_backward: grad must be [B, H], got shape ",
                    grad.sizes());
  TORCH_CHECK_VALUE(mask.dim() == 2 && mask.size(0) == grad.size(0),
                    "masked_mean_backward: mask must be [B, T] with B = ", grad.size(0),
                    " like grad, got shape ", mask.sizes());
  TORCH_CHECK_TYPE(is_kernel_float(grad),
                   "masked_mean_backward: grad must be floating point (float64, float32, float16 "
                   "or bfloat16), got ", grad.scalar_type());
  check_mask_dtype(mask, "masked_mean_backward");
  TORCH_CHECK_VALUE(mask.device() == grad.device(), "masked_mean_backward: mask is on ",
                    mask.device(), " but grad on ", grad.device());
}

}  // namespace reasonrl_fast
