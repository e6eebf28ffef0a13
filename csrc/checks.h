// Input validation (and the backward's input preparation) shared by the CPU (csrc/*.cpp) and
// CUDA (csrc/kernels/*.cu) kernels, so both devices reject the same inputs with the same
// messages. Shape, dtype and device checks only; data checks (target ids in range) are the
// kernels' own, since they need the data.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace reasonrl_fast {

inline bool is_integer_dtype(const at::Tensor& t) {
  return !at::isFloatingType(t.scalar_type()) && !t.is_complex() && t.scalar_type() != at::kBool;
}

inline void check_token_logprob(const at::Tensor& logits, const at::Tensor& target,
                                double temperature) {
  TORCH_CHECK(logits.dim() >= 1, "token_logprob: logits must have a vocabulary dimension");
  TORCH_CHECK(at::isFloatingType(logits.scalar_type()),
              "token_logprob: logits must be floating point, got ", logits.scalar_type());
  TORCH_CHECK(is_integer_dtype(target),
              "token_logprob: target ids must be an integer tensor, got ", target.scalar_type());
  TORCH_CHECK(target.sizes() == logits.sizes().slice(0, logits.dim() - 1),
              "token_logprob: target shape ", target.sizes(),
              " must equal the logits shape without its last dimension ", logits.sizes());
  TORCH_CHECK(temperature > 0 && std::isfinite(temperature),
              "token_logprob: temperature must be a positive finite number, got ", temperature);
  TORCH_CHECK(logits.size(-1) > 0 || target.numel() == 0,
              "token_logprob: the vocabulary dimension is empty");
  TORCH_CHECK(target.device() == logits.device(), "token_logprob: target is on ",
              target.device(), " but logits on ", logits.device());
}

// The logits as the kernels read them: a strided view is kept (no copy of [N, V]) unless the
// vocabulary dimension itself is strided.
inline at::Tensor rows_view(const at::Tensor& logits) {
  return logits.stride(-1) == 1 || logits.size(-1) <= 1 ? logits : logits.contiguous();
}

// token_logprob's backward inputs, checked, contiguous and in the accumulation dtype (that of
// lse). grad_entropy and entropy stay undefined when no entropy gradient flows.
struct LogprobBackwardInputs {
  at::Tensor target, grad_logprob, grad_entropy, lse, entropy;
  bool has_entropy;
};

inline LogprobBackwardInputs prepare_logprob_backward(const at::Tensor& grad_logprob,
                                                      const c10::optional<at::Tensor>& grad_entropy,
                                                      const at::Tensor& target,
                                                      const at::Tensor& lse,
                                                      const at::Tensor& entropy) {
  const bool has_ent = grad_entropy.has_value() && grad_entropy->defined();
  TORCH_CHECK(!has_ent || entropy.numel() == target.numel(),
              "token_logprob_backward: an entropy gradient needs the forward's entropy");
  const auto acc = lse.scalar_type();
  return {target.to(at::kLong).contiguous(),
          grad_logprob.to(acc).contiguous(),
          has_ent ? grad_entropy->to(acc).contiguous() : at::Tensor(),
          lse.contiguous(),
          has_ent ? entropy.to(acc).contiguous() : at::Tensor(),
          has_ent};
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
