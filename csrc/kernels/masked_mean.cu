// CUDA kernels of masked_mean, the Z-head's pooling (docs/math.md §Masked mean), same schemas,
// semantics and messages as csrc/masked_mean.cpp: out[b] = Σ_t x[b, t] m[b, t] / Σ_t m[b, t],
// 0 (and zero gradient) where Σ_t m[b, t] == 0 (an empty mask, or weights that cancel such as
// [1, -1]), accumulated in float32 (float64 for float64).
//
// Forward: grid (B, H / (threads * VEC), token splits); each thread owns VEC consecutive
// features (one 16-byte load per token when H is a multiple of VEC and x is aligned, else
// scalar loads) and walks its share of the tokens, skipping masked-out ones. Backward: grid over (B * T, H chunks), one
// 16-byte store per VEC features where alignment allows.
#include <torch/library.h>

#include "checks.h"
#include "common.cuh"

namespace reasonrl_fast {
namespace cuda {
namespace {

constexpr int kThreads = 128;

// Forward: grid (B, H chunks, S). Block (b, c, s) walks the tokens [s T / S, (s + 1) T / S)
// for its features. With S == 1 it writes the mean; else it writes its partial sum to
// partial[s, b, h] and finalize_kernel adds the S partials in order (deterministic). One
// block per (b, H chunk) walking all T tokens gave about 16 blocks for B = 4, H = 3584 on 132
// multiprocessors: each thread's serial walk over T set the time.
template <typename scalar_t, typename acc_t, bool kVec>
__global__ void __launch_bounds__(kThreads)
    masked_mean_kernel(const scalar_t* __restrict__ x, const acc_t* __restrict__ mask,
                       const acc_t* __restrict__ count, int64_t B, int64_t T, int64_t H,
                       scalar_t* __restrict__ out, acc_t* __restrict__ partial) {
  using V16 = Vec16<scalar_t>;
  constexpr int VEC = kVec ? V16::kSize : 1;
  const int64_t b = blockIdx.x;
  const int64_t h0 = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * VEC;
  if (h0 >= H) return;
  const int64_t S = gridDim.z, s = blockIdx.z;
  const int64_t t0 = T * s / S, t1 = T * (s + 1) / S;
  acc_t acc[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] = 0;
#pragma unroll 4
  for (int64_t t = t0; t < t1; ++t) {
    const acc_t m = mask[b * T + t];
    if (m == 0) continue;  // prompts are short next to T: skip padding rows outright
    const scalar_t* row = x + (b * T + t) * H + h0;
    if constexpr (kVec) {
      const V16 v = *reinterpret_cast<const V16*>(row);
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] += static_cast<acc_t>(v.v[j]) * m;
    } else {
      acc[0] += static_cast<acc_t>(row[0]) * m;
    }
  }
  if (S > 1) {
    acc_t* p = partial + (s * B + b) * H + h0;
#pragma unroll
    for (int j = 0; j < VEC; ++j) p[j] = acc[j];
    return;
  }
  const acc_t n = count[b];
  const acc_t inv = n != 0 ? acc_t(1) / n : acc_t(0);
  scalar_t* o = out + b * H + h0;
#pragma unroll
  for (int j = 0; j < VEC; ++j) o[j] = static_cast<scalar_t>(acc[j] * inv);
}

template <typename scalar_t, typename acc_t>
__global__ void finalize_kernel(const acc_t* __restrict__ partial, const acc_t* __restrict__ count,
                                int64_t S, int64_t B, int64_t H, scalar_t* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < B * H;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc_t acc = 0;
    for (int64_t s = 0; s < S; ++s) acc += partial[s * B * H + i];
    const acc_t n = count[i / H];
    out[i] = static_cast<scalar_t>(n != 0 ? acc / n : acc_t(0));
  }
}

// Token splits so that the forward has about four blocks per multiprocessor, each walking at
// least 32 tokens.
int64_t token_splits(int64_t blocks, int64_t T) {
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c10::cuda::current_device()));
  const int64_t want = (4 * static_cast<int64_t>(sms) + blocks - 1) / blocks;
  return std::max<int64_t>(1, std::min<int64_t>({want, T / 32, 65535}));
}

template <typename scalar_t, typename acc_t, bool kVec>
__global__ void __launch_bounds__(kThreads)
    masked_mean_backward_kernel(const scalar_t* __restrict__ grad, const acc_t* __restrict__ mask,
                                const acc_t* __restrict__ count, int64_t T, int64_t H,
                                scalar_t* __restrict__ out) {
  using V16 = Vec16<scalar_t>;
  constexpr int VEC = kVec ? V16::kSize : 1;
  const int64_t bt = blockIdx.x;
  const int64_t b = bt / T;
  const int64_t h0 = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * VEC;
  if (h0 >= H) return;
  const acc_t n = count[b];
  const acc_t c = n != 0 ? mask[bt] / n : acc_t(0);
  const scalar_t* g = grad + b * H + h0;
  scalar_t* o = out + bt * H + h0;
  if constexpr (kVec) {
    const V16 gv = *reinterpret_cast<const V16*>(g);
    V16 ov;
#pragma unroll
    for (int j = 0; j < VEC; ++j) ov.v[j] = static_cast<scalar_t>(static_cast<acc_t>(gv.v[j]) * c);
    *reinterpret_cast<V16*>(o) = ov;
  } else {
    o[0] = static_cast<scalar_t>(static_cast<acc_t>(g[0]) * c);
  }
}

// CUDA grids hold at most 2^31 - 1 blocks in x and 65535 in y.
void check_grid(int64_t x, int64_t y, const char* op) {
  TORCH_CHECK_VALUE(x < (int64_t(1) << 31) && y <= 65535, op,
                    ": too large for one launch (grid ", x, " x ", y, ")");
}

template <typename scalar_t>
bool can_vec(const void* p, int64_t H) {
  return H % Vec16<scalar_t>::kSize == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

at::Tensor masked_mean_cuda(const at::Tensor& x_in, const at::Tensor& mask_in) {
  check_masked_mean(x_in, mask_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2);
  at::Tensor out = at::empty({B, H}, x.options());
  if (out.numel() == 0) return out;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "masked_mean_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc = c10::CppTypeToScalarType<acc_t>::value;
    const at::Tensor mask = mask_in.to(x.device(), acc).contiguous();
    const at::Tensor count = mask.sum(1);
    const bool vec = can_vec<scalar_t>(x.data_ptr(), H) && can_vec<scalar_t>(out.data_ptr(), H);
    const int64_t per_block = kThreads * (vec ? Vec16<scalar_t>::kSize : 1);
    check_grid(B, (H + per_block - 1) / per_block, "masked_mean");
    const int64_t chunks = (H + per_block - 1) / per_block;
    const int64_t S = token_splits(B * chunks, T);
    const dim3 grid(static_cast<unsigned>(B), static_cast<unsigned>(chunks), static_cast<unsigned>(S));
    at::Tensor partial = S > 1 ? at::empty({S, B, H}, x.options().dtype(acc)) : at::Tensor();
    acc_t* pp = S > 1 ? partial.data_ptr<acc_t>() : nullptr;
    if (vec) {
      masked_mean_kernel<scalar_t, acc_t, true><<<grid, kThreads, 0, stream>>>(
          x.data_ptr<scalar_t>(), mask.data_ptr<acc_t>(), count.data_ptr<acc_t>(), B, T, H,
          out.data_ptr<scalar_t>(), pp);
    } else {
      masked_mean_kernel<scalar_t, acc_t, false><<<grid, kThreads, 0, stream>>>(
          x.data_ptr<scalar_t>(), mask.data_ptr<acc_t>(), count.data_ptr<acc_t>(), B, T, H,
          out.data_ptr<scalar_t>(), pp);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (S > 1) {
      const int64_t blocks = std::min<int64_t>((B * H + 255) / 256, 65535);
      finalize_kernel<scalar_t, acc_t><<<blocks, 256, 0, stream>>>(
          pp, count.data_ptr<acc_t>(), S, B, H, out.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  return out;
}

at::Tensor masked_mean_backward_cuda(const at::Tensor& grad_in, const at::Tensor& mask_in) {
  check_masked_mean_backward(grad_in, mask_in);
  const c10::cuda::CUDAGuard guard(grad_in.device());
  const at::Tensor grad = grad_in.contiguous();
  const int64_t B = mask_in.size(0), T = mask_in.size(1), H = grad.size(1);
  at::Tensor out = at::empty({B, T, H}, grad.options());
  if (out.numel() == 0) return out;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(), "masked_mean_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc = c10::CppTypeToScalarType<acc_t>::value;
    const at::Tensor mask = mask_in.to(grad.device(), acc).contiguous();
    const at::Tensor count = mask.sum(1);
    const bool vec = can_vec<scalar_t>(grad.data_ptr(), H) && can_vec<scalar_t>(out.data_ptr(), H);
    const int64_t per_block = kThreads * (vec ? Vec16<scalar_t>::kSize : 1);
    check_grid(B * T, (H + per_block - 1) / per_block, "masked_mean_backward");
    const dim3 grid(static_cast<unsigned>(B * T), static_cast<unsigned>((H + per_block - 1) / per_block));
    if (vec) {
      masked_mean_backward_kernel<scalar_t, acc_t, true><<<grid, kThreads, 0, stream>>>(
          grad.data_ptr<scalar_t>(), mask.data_ptr<acc_t>(), count.data_ptr<acc_t>(), T, H,
          out.data_ptr<scalar_t>());
    } else {
      masked_mean_backward_kernel<scalar_t, acc_t, false><<<grid, kThreads, 0, stream>>>(
          grad.data_ptr<scalar_t>(), mask.data_ptr<acc_t>(), count.data_ptr<acc_t>(), T, H,
          out.data_ptr<scalar_t>());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(reasonrl_fast, CUDA, m) {
  m.impl("masked_mean", &cuda::masked_mean_cuda);
  m.impl("masked_mean_backward", &cuda::masked_mean_backward_cuda);
}

}  // namespace reasonrl_fast
