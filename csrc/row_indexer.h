// RowIndexer: the one definition of row offsets for the CPU kernels (csrc/*.cpp, via common.h)
// and the CUDA kernels (csrc/kernels/*.cu, via common.cuh), so that both devices read strided
// views the same way.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>

// A function callable from host and device code under nvcc, and a plain inline function for the
// C++ compiler (which knows neither attribute). Forced inline on the device: offset() runs once
// per row at the top of every kernel's row loop.
#if defined(__CUDACC__)
#define RRL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define RRL_HOST_DEVICE inline
#endif

namespace reasonrl_fast {

// Offsets of the rows of a tensor whose last dimension is contiguous but whose leading
// dimensions may be strided (e.g. logits[:, :-1, :]), so that slicing never forces a copy
// of the [N, V] logits. Built on the host; passed by value to a CUDA kernel (trivially
// copyable, no pointers into host memory).
struct RowIndexer {
  static constexpr int kMaxDims = 12;
  int ndim = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];

  explicit RowIndexer(const at::Tensor& t) {
    ndim = static_cast<int>(t.dim()) - 1;
    TORCH_CHECK(ndim < kMaxDims, "reasonrl_fast: at most ", kMaxDims, " leading dimensions");
    for (int d = 0; d < ndim; ++d) {
      sizes[d] = t.size(d);
      strides[d] = t.stride(d);
    }
  }
  RRL_HOST_DEVICE int64_t offset(int64_t row) const {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      off += (row % sizes[d]) * strides[d];
      row /= sizes[d];
    }
    return off;
  }
};

}  // namespace reasonrl_fast
