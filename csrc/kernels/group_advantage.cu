// CUDA kernel of group_advantage (docs/math.md §Group advantage), same schema, semantics and
// messages as csrc/group_advantage.cpp.
//
// Group ids are arbitrary and groups need not be contiguous. Up to kTiledMax responses the
// whole op is ONE launch: each thread owns one response and streams all (id, reward) pairs
// through shared memory three times (group sum and count; the CPU kernel's correction of the
// mean; the squared deviations from it), in double, in index order, so the result is
// deterministic and rounds as the CPU kernel's does. That is
// O(B^2 / threads) work, a few microseconds for B of a few thousand. Above kTiledMax the op
// falls back to sort-free ATen segment reductions (unique + index_add), several launches.
#include <torch/library.h>

#include "checks.h"
#include "common.cuh"

namespace reasonrl_fast {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kTiledMax = 1 << 16;

// Calls f(reward) for every response of group g, in index order (the CPU kernel's order, so
// sums round the same way), streaming all (id, reward) pairs through shared memory one tile at
// a time. Every thread of the block must call it, whatever its own group (it synchronises).
template <typename r_t, typename g_t, typename F>
__device__ void for_each_in_group(const r_t* __restrict__ rewards, const g_t* __restrict__ gids,
                                  int64_t B, int64_t g, double* sr, int64_t* sg, F&& f) {
  for (int64_t t0 = 0; t0 < B; t0 += kThreads) {
    const int64_t j = t0 + threadIdx.x;
    __syncthreads();
    if (j < B) {
      sr[threadIdx.x] = static_cast<double>(rewards[j]);
      sg[threadIdx.x] = static_cast<int64_t>(gids[j]);
    }
    __syncthreads();
    const int len = static_cast<int>(B - t0 < kThreads ? B - t0 : kThreads);
    for (int k = 0; k < len; ++k) {
      if (sg[k] == g) f(sr[k]);
    }
  }
}

template <typename r_t, typename g_t>
__global__ void __launch_bounds__(kThreads)
    group_adv_kernel(const r_t* __restrict__ rewards, const g_t* __restrict__ gids, int64_t B,
                     double eps, bool norm_by_std, float* __restrict__ out) {
  __shared__ double sr[kThreads];
  __shared__ int64_t sg[kThreads];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool live = i < B;
  const int64_t g = live ? static_cast<int64_t>(gids[i]) : 0;
  const double r = live ? static_cast<double>(rewards[i]) : 0.0;
  double sum = 0, cnt = 0;
  for_each_in_group(rewards, gids, B, g, sr, sg, [&](double x) {
    sum += x;
    cnt += 1;
  });
  // The CPU kernel's correction pass: makes the mean exact for equal rewards, so they get
  // exactly 0 rather than rounding noise divided by eps (or by 0 when eps = 0). Every thread of
  // the block runs it, also one whose group has a single member (whose mean is 0, std 1): the
  // pass synchronises the block, and a __syncthreads() that some threads skip is undefined
  // behaviour (it hung, or mixed up the shared tiles, on an H100).
  double mean = sum / (cnt > 0 ? cnt : 1.0);
  double c = 0;
  for_each_in_group(rewards, gids, B, g, sr, sg, [&](double x) { c += x - mean; });
  mean = cnt > 1 ? mean + c / cnt : 0.0;
  double ss = 0;
  if (norm_by_std) {
    // __dmul_rn: no fused multiply-add, so the sum of squares rounds as on the CPU.
    for_each_in_group(rewards, gids, B, g, sr, sg,
                      [&](double x) { ss += __dmul_rn(x - mean, x - mean); });
  }
  if (!live) return;
  const double a = r - mean;
  if (norm_by_std) {
    const double std = cnt > 1 ? ::sqrt(ss / (cnt - 1)) : 1.0;  // unbiased, as torch.std
    out[i] = static_cast<float>(a / (std + eps));
  } else {
    out[i] = static_cast<float>(a);
  }
}

at::Tensor group_advantage_aten(const at::Tensor& rewards, const at::Tensor& group_ids,
                                double eps, bool norm_by_std) {
  const at::Tensor r = rewards.to(at::kDouble);
  const at::Tensor g = group_ids.to(at::kLong);
  at::Tensor uniq, inv, counts;
  std::tie(uniq, inv, counts) = at::_unique2(g, /*sorted=*/true, /*return_inverse=*/true,
                                             /*return_counts=*/true);
  const int64_t G = uniq.numel();
  const at::Tensor k = counts.to(at::kDouble);
  at::Tensor mean = at::zeros({G}, r.options()).index_add_(0, inv, r) / k;
  // The correction pass of the tiled kernel (exact means for equal rewards).
  mean += at::zeros({G}, r.options()).index_add_(0, inv, r - mean.index_select(0, inv)) / k;
  mean = at::where(counts > 1, mean, at::zeros_like(mean));
  const at::Tensor a = r - mean.index_select(0, inv);
  if (!norm_by_std) return a.to(at::kFloat);
  const at::Tensor ss = at::zeros({G}, r.options()).index_add_(0, inv, a * a);
  at::Tensor std = at::sqrt(ss / (k - 1).clamp_min(1));
  std = at::where(counts > 1, std, at::ones_like(std));
  return (a / (std.index_select(0, inv) + eps)).to(at::kFloat);
}

at::Tensor group_advantage_cuda(const at::Tensor& rewards_in, const at::Tensor& group_ids_in,
                                double eps, bool norm_by_std) {
  check_group_advantage(rewards_in, group_ids_in, eps);
  const c10::cuda::CUDAGuard guard(rewards_in.device());
  const int64_t B = rewards_in.size(0);
  if (B == 0) return at::empty({0}, rewards_in.options().dtype(at::kFloat));
  if (B > kTiledMax) return group_advantage_aten(rewards_in, group_ids_in, eps, norm_by_std);
  const at::Tensor r = rewards_in.contiguous();
  // The kernel is instantiated for int32 and int64 ids; narrower or unsigned ones widen.
  const auto gdt = group_ids_in.scalar_type();
  const at::Tensor g = gdt == at::kInt || gdt == at::kLong ? group_ids_in.contiguous()
                                                           : group_ids_in.to(at::kLong);
  at::Tensor out = at::empty({B}, rewards_in.options().dtype(at::kFloat));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t blocks = (B + kThreads - 1) / kThreads;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, r.scalar_type(), "group_advantage_cuda", [&] {
    using r_t = scalar_t;
    AT_DISPATCH_INDEX_TYPES(g.scalar_type(), "group_advantage_cuda_ids", [&] {
      group_adv_kernel<r_t, index_t><<<blocks, kThreads, 0, stream>>>(
          r.data_ptr<r_t>(), g.data_ptr<index_t>(), B, eps, norm_by_std, out.data_ptr<float>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return out;
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(reasonrl_fast, CUDA, m) { m.impl("group_advantage", &cuda::group_advantage_cuda); }

}  // namespace reasonrl_fast
