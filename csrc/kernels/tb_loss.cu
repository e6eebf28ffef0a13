// CUDA kernels of the FlowRL trajectory-balance loss (docs/math.md §FlowRL trajectory balance),
// same schemas, semantics and messages as csrc/tb_loss.cpp.
//
// Forward: one block per sequence reduces the four masked token sums in double and writes
// delta[b] and the importance weight w[b]; a second one-block kernel sums w δ² over the batch
// in a fixed order (deterministic) and divides by B. Backward: one block per sequence. The
// upstream gradient is read on the device (no .item() synchronisation).
#include <torch/library.h>

#include "checks.h"
#include "common.cuh"

namespace reasonrl_fast {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr double kLenEps = 1e-8;  // n + 1e-8, as in verl

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    tb_seq_kernel(const scalar_t* __restrict__ lz, const scalar_t* __restrict__ lp,
                  const scalar_t* __restrict__ ref, const scalar_t* __restrict__ old,
                  const scalar_t* __restrict__ rw, const scalar_t* __restrict__ mk, int64_t B,
                  int64_t T, double beta, double min_w, double max_w, scalar_t* __restrict__ delta,
                  scalar_t* __restrict__ w) {
  __shared__ double shm[kWarp];
  for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
    const int64_t base = b * T;
    double n = 0, s_lp = 0, s_ref = 0, s_ratio = 0;
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
      const double m = static_cast<double>(mk[base + t]);
      const double l = static_cast<double>(lp[base + t]);
      n += m;
      s_lp += l * m;
      s_ref += static_cast<double>(ref[base + t]) * m;
      s_ratio += (l - static_cast<double>(old[base + t])) * m;
    }
    n = block_sum(n, shm);
    s_lp = block_sum(s_lp, shm);
    s_ref = block_sum(s_ref, shm);
    s_ratio = block_sum(s_ratio, shm);
    if (threadIdx.x == 0) {
      const double denom = n + kLenEps;
      delta[b] = static_cast<scalar_t>(static_cast<double>(lz[b]) + s_lp / denom -
                                        beta * static_cast<double>(rw[b]) - s_ref / denom);
      // Comparisons, not fmin/fmax: those return the other operand for a NaN, which would turn
      // a NaN weight (a NaN log-prob) into a bound and silently drop the sequence from the loss.
      const double e = ::exp(s_ratio);
      w[b] = static_cast<scalar_t>(e < min_w ? min_w : (e > max_w ? max_w : e));
    }
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(1024)
    tb_mean_kernel(const scalar_t* __restrict__ delta, const scalar_t* __restrict__ w, int64_t B,
                   scalar_t* __restrict__ loss) {
  __shared__ double shm[kWarp];
  double total = 0;
  for (int64_t b = threadIdx.x; b < B; b += blockDim.x) {
    const double d = static_cast<double>(delta[b]);
    total += static_cast<double>(w[b]) * d * d;
  }
  total = block_sum(total, shm);
  if (threadIdx.x == 0) *loss = static_cast<scalar_t>(total / static_cast<double>(B));
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    tb_backward_kernel(const scalar_t* __restrict__ g_loss, const scalar_t* __restrict__ delta,
                       const scalar_t* __restrict__ w, const scalar_t* __restrict__ mk, int64_t B,
                       int64_t T, scalar_t* __restrict__ glz, scalar_t* __restrict__ glp) {
  __shared__ double shm[kWarp];
  const double g = static_cast<double>(*g_loss);
  for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
    const int64_t base = b * T;
    double n = 0;
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) n += static_cast<double>(mk[base + t]);
    n = block_sum(n, shm);
    const double c = g * 2.0 * static_cast<double>(w[b]) * static_cast<double>(delta[b]) /
                     static_cast<double>(B);
    if (threadIdx.x == 0) glz[b] = static_cast<scalar_t>(c);
    const double ct = c / (n + kLenEps);
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x)
      glp[base + t] = static_cast<scalar_t>(ct * static_cast<double>(mk[base + t]));
  }
}

// `io` comes from tb_loss_op (checks.h): checked, converted, outputs allocated, B > 0.
void tb_loss_into(const TbLossTensors& io, double beta, double min_w, double max_w) {
  const c10::cuda::CUDAGuard guard(io.logprob.device());
  const int64_t B = io.logprob.size(0), T = io.logprob.size(1);
  const at::Tensor &lz = io.log_z, &lp = io.logprob, &ref = io.ref_logprob, &old = io.old_logprob,
                   &rw = io.reward, &mk = io.mask, &loss = io.loss, &delta = io.delta,
                   &w = io.weight;
  const auto dt = lp.scalar_type();
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(dt, "tb_loss_cuda", [&] {
    tb_seq_kernel<scalar_t><<<grid_for(B), kThreads, 0, stream>>>(
        lz.data_ptr<scalar_t>(), lp.data_ptr<scalar_t>(), ref.data_ptr<scalar_t>(),
        old.data_ptr<scalar_t>(), rw.data_ptr<scalar_t>(), mk.data_ptr<scalar_t>(), B, T, beta,
        min_w, max_w, delta.data_ptr<scalar_t>(), w.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    tb_mean_kernel<scalar_t><<<1, 1024, 0, stream>>>(delta.data_ptr<scalar_t>(),
                                                       w.data_ptr<scalar_t>(), B,
                                                       loss.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// `io` comes from tb_loss_backward_op (checks.h): checked, converted, outputs allocated, B > 0.
void tb_loss_backward_into(const TbLossBackwardTensors& io) {
  const c10::cuda::CUDAGuard guard(io.delta.device());
  const int64_t B = io.mask.size(0), T = io.mask.size(1);
  const at::Tensor &g_lz = io.grad_log_z, &g_lp = io.grad_logprob;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(io.delta.scalar_type(), "tb_loss_backward_cuda", [&] {
    tb_backward_kernel<scalar_t><<<grid_for(B), kThreads, 0, stream>>>(
        io.grad_loss.data_ptr<scalar_t>(), io.delta.data_ptr<scalar_t>(),
        io.weight.data_ptr<scalar_t>(), io.mask.data_ptr<scalar_t>(), B, T,
        g_lz.data_ptr<scalar_t>(), g_lp.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(reasonrl_fast, CUDA, m) {
  m.impl("tb_loss", &tb_loss_op<cuda::tb_loss_into>);
  m.impl("tb_loss_backward", &tb_loss_backward_op<cuda::tb_loss_backward_into>);
}

}  // namespace reasonrl_fast
