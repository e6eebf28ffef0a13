// Shared helpers for the CUDA kernels of reasonrl_fast (csrc/kernels/*.cu).
//
// Conventions: every kernel runs on the current stream of the inputs' device (with a device
// guard), indexes with int64_t, and is followed by C10_CUDA_KERNEL_LAUNCH_CHECK().
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAStream.h>  // not ATen/cuda/CUDAContext.h: no cuBLAS/cuSPARSE headers needed
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/macros/Macros.h>

#include <cstdint>
#include <limits>

#include "row_indexer.h"

namespace reasonrl_fast {
namespace cuda {

constexpr int kWarp = 32;

// 16-byte vector of scalar_t: one ld.global.v4 / st.global.v4 per access when aligned.
template <typename scalar_t>
struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / sizeof(scalar_t);
  scalar_t v[kSize];
};

__device__ __forceinline__ float fexp(float x) { return __expf(x); }
__device__ __forceinline__ double fexp(double x) { return ::exp(x); }

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); the result is valid in
// every thread. `shm` holds 32 values. Deterministic for a fixed block size.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* shm) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // shm may still be read by a previous call
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x / kWarp;
  v = lane < nwarps ? shm[lane] : T(0);
  return warp_sum(v);
}

// Rows are spread over blocks with a grid-stride loop; a grid of at most this many blocks.
constexpr int64_t kMaxGrid = 1 << 30;

inline int64_t grid_for(int64_t n) { return std::max<int64_t>(1, std::min<int64_t>(n, kMaxGrid)); }

}  // namespace cuda
}  // namespace reasonrl_fast
