// CUDA kernels of token_logprob (docs/math.md §Token log-prob and entropy), same schemas,
// semantics and error messages as csrc/token_logprob.cpp.
//
// One block per row (grid-stride over rows). Forward reads each logit once: every thread keeps
// an online (max m, S = Σ exp(s − m), E = Σ exp(s − m)(s − m)) over its elements, read as
// 16-byte vectors (four in flight per thread) after a scalar head that reaches 16-byte
// alignment, updated once per 32 values, and the block merges the triples. Backward reads
// each logit once more and writes dz once (in place for token_logprob_backward_).
//
// Out-of-range target ids: the host cannot check them without a synchronisation, so both
// kernels check them on the device. A bad id prints the row and id from the device and fails a
// device-side assertion; PyTorch reports it as a RuntimeError ("device-side assert triggered")
// at the next synchronising call the caller makes (.item(), .cpu(), torch.cuda.synchronize(),
// ...). As with PyTorch's own gather/nll_loss, the CUDA context is unusable afterwards; run
// with CUDA_LAUNCH_BLOCKING=1 to see the failing call. The kernels never read or write at a bad
// id, asserts or not: with device assertions compiled out (TORCH_DISABLE_GPU_ASSERTS) that
// row's outputs (forward) or gradient row (backward) are NaN. uint64 ids above the int64 range
// arrive as INT64_MAX (target_as_long), so they are caught the same way.
//
// Masked (-inf) logits: p = 0 there and the gradient is exactly 0 (a select, never 0 * inf).
#include <torch/library.h>

#include "checks.h"
#include "common.cuh"

namespace reasonrl_fast {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <typename acc_t>
struct Online {
  acc_t m, S, E;
  int bad;

  __device__ __forceinline__ void init() {
    m = -std::numeric_limits<acc_t>::infinity();
    S = 0;
    E = 0;
    bad = 0;
  }
  // K values at once: one max and at most one rescale per chunk, then K independent exps
  // (two partial sums each), instead of a serial max/rescale/exp chain per element. On an H200
  // at N=16384, V=152064 (bf16) the per-element chain ran at 49 % of the copy bandwidth.
  template <int K, bool kEnt>
  __device__ __forceinline__ void add_chunk(const acc_t (&x)[K]) {
    constexpr acc_t kInf = std::numeric_limits<acc_t>::infinity();
    acc_t mx = m;
#pragma unroll
    for (int j = 0; j < K; ++j) {
      bad |= !(x[j] < kInf);  // NaN or +inf: the row is NaN, as in PyTorch
      mx = x[j] > mx ? x[j] : mx;
    }
    if (mx > m) {
      if (S > 0) {
        // r = 0 (the old maximum is dtype-minimum-like, e.g. a mask filled with finfo.min):
        // the old terms vanish. Computed, (m - mx) * S overflows to -inf and 0 * -inf is NaN.
        const acc_t r = fexp(m - mx);
        if (kEnt) E = r > acc_t(0) ? r * (E + (m - mx) * S) : acc_t(0);
        S = r * S;
      }
      m = mx;
    }
    if (m == -kInf) return;  // all -inf so far
    acc_t s0 = 0, s1 = 0, e0 = 0, e1 = 0;
#pragma unroll
    for (int j = 0; j < K; j += 2) {
      const acc_t d0 = x[j] - m, d1 = x[j + 1] - m;
      const acc_t x0 = fexp(d0), x1 = fexp(d1);
      s0 += x0;
      s1 += x1;
      if (kEnt) {
        e0 += x0 > 0 ? x0 * d0 : acc_t(0);  // 0 * log 0 = 0 for masked (-inf) logits
        e1 += x1 > 0 ? x1 * d1 : acc_t(0);
      }
    }
    S += s0 + s1;
    if (kEnt) E += e0 + e1;
  }
  __device__ __forceinline__ void merge(acc_t om, acc_t oS, acc_t oE, int obad) {
    constexpr acc_t kInf = std::numeric_limits<acc_t>::infinity();
    bad |= obad;
    const acc_t M = om > m ? om : m;
    if (M == -kInf) return;
    acc_t nS = 0, nE = 0;
    // As in add_chunk: a side whose scale r underflows to 0 adds nothing (never 0 * -inf).
    if (S > 0) {
      const acc_t r = fexp(m - M);
      nS += r * S;
      if (r > acc_t(0)) nE += r * (E + (m - M) * S);
    }
    if (oS > 0) {
      const acc_t r = fexp(om - M);
      nS += r * oS;
      if (r > acc_t(0)) nE += r * (oE + (om - M) * oS);
    }
    m = M;
    S = nS;
    E = nE;
  }
};

// Every lane of the warp ends with the merge of the warp's 32 triples.
template <typename acc_t>
__device__ __forceinline__ void warp_merge(Online<acc_t>& st) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const acc_t om = __shfl_xor_sync(0xffffffffu, st.m, o);
    const acc_t oS = __shfl_xor_sync(0xffffffffu, st.S, o);
    const acc_t oE = __shfl_xor_sync(0xffffffffu, st.E, o);
    const int ob = __shfl_xor_sync(0xffffffffu, st.bad, o);
    st.merge(om, oS, oE, ob);
  }
}

template <typename acc_t>
__device__ __forceinline__ void block_merge(Online<acc_t>& st) {
  __shared__ acc_t sm[kWarp], sS[kWarp], sE[kWarp];
  __shared__ int sb[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  warp_merge(st);
  __syncthreads();
  if (lane == 0) {
    sm[warp] = st.m;
    sS[warp] = st.S;
    sE[warp] = st.E;
    sb[warp] = st.bad;
  }
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x / kWarp;
    st.init();
    if (lane < nwarps) st.merge(sm[lane], sS[lane], sE[lane], sb[lane]);
    warp_merge(st);
  }
}

// Elements before the first 16-byte boundary of a row (rows of a strided view or with V not a
// multiple of the vector width need not start aligned).
template <typename scalar_t>
__device__ __forceinline__ int64_t aligned_head(const scalar_t* p, int64_t V) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a % sizeof(scalar_t) != 0) return V;  // cannot align: all scalar
  const int64_t h = static_cast<int64_t>(((16 - (a & 15)) & 15) / sizeof(scalar_t));
  return h < V ? h : V;
}

// True (after printing the id and failing a device-side assertion, when those are compiled
// in) for a target outside [0, V) that is not ignore_index: the caller must then neither read
// nor write at y. The same value in every thread of the block, so a `continue` on it is uniform.
__device__ __forceinline__ bool bad_target(int64_t y, int64_t n, int64_t V, int64_t ignore_index) {
  if (y >= 0 && y < V) return false;
  if (threadIdx.x == 0)
    printf("token_logprob: target id %lld at flat position %lld is outside the vocabulary "
           "[0, %lld) and is not ignore_index (%lld)\n",
           (long long)y, (long long)n, (long long)V, (long long)ignore_index);
  CUDA_KERNEL_ASSERT(y >= 0 && y < V);
  return true;
}

// Vectors each thread loads before it computes: U * 16 bytes in flight per thread, enough
// to cover the memory latency at 256 threads a block.
constexpr int kUnroll = 4;

template <typename scalar_t, typename acc_t, bool kEnt>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const scalar_t* __restrict__ z, RowIndexer rows, const int64_t* __restrict__ tgt,
                   int64_t N, int64_t V, acc_t inv_tau, int64_t ignore_index,
                   acc_t* __restrict__ lp, acc_t* __restrict__ ent, acc_t* __restrict__ lse) {
  using V16 = Vec16<scalar_t>;
  constexpr int VEC = V16::kSize;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const int64_t y = tgt[n];
    if (y == ignore_index) {
      if (threadIdx.x == 0) {
        lp[n] = 0;
        lse[n] = 0;
        if (kEnt) ent[n] = 0;
      }
      continue;
    }
    if (bad_target(y, n, V, ignore_index)) {
      if (threadIdx.x == 0) {
        const acc_t nan = std::numeric_limits<acc_t>::quiet_NaN();
        lp[n] = nan;
        lse[n] = nan;
        if (kEnt) ent[n] = nan;
      }
      continue;
    }
    const scalar_t* row = z + rows.offset(n);
    Online<acc_t> st;
    st.init();
    const int64_t head = aligned_head(row, V);
    for (int64_t i = threadIdx.x; i < head; i += blockDim.x) {
      const acc_t x[2] = {static_cast<acc_t>(row[i]) * inv_tau,
                          -std::numeric_limits<acc_t>::infinity()};
      st.template add_chunk<2, kEnt>(x);
    }
    const int64_t nvec = (V - head) / VEC;
    const V16* vrow = reinterpret_cast<const V16*>(row + head);
    const int64_t stride = blockDim.x;
    int64_t k = threadIdx.x;
    for (; k + (kUnroll - 1) * stride < nvec; k += kUnroll * stride) {
      V16 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = vrow[k + u * stride];
      acc_t x[kUnroll * VEC];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int j = 0; j < VEC; ++j) x[u * VEC + j] = static_cast<acc_t>(v[u].v[j]) * inv_tau;
      st.template add_chunk<kUnroll * VEC, kEnt>(x);
    }
    for (; k < nvec; k += stride) {
      const V16 v = vrow[k];
      acc_t x[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[j] = static_cast<acc_t>(v.v[j]) * inv_tau;
      st.template add_chunk<VEC, kEnt>(x);
    }
    for (int64_t i = head + nvec * VEC + threadIdx.x; i < V; i += blockDim.x) {
      const acc_t x[2] = {static_cast<acc_t>(row[i]) * inv_tau,
                          -std::numeric_limits<acc_t>::infinity()};
      st.template add_chunk<2, kEnt>(x);
    }
    block_merge(st);
    if (threadIdx.x == 0) {
      const acc_t nan = std::numeric_limits<acc_t>::quiet_NaN();
      const acc_t log_s = ::log(st.S);
      const acc_t l = st.bad ? nan : st.m + log_s;
      lse[n] = l;
      lp[n] = static_cast<acc_t>(row[y]) * inv_tau - l;
      if (kEnt) ent[n] = st.bad ? nan : log_s - st.E / st.S;
    }
    __syncthreads();  // the shared buffers of block_merge are reused by the next row
  }
}

template <typename scalar_t, typename acc_t>
__device__ __forceinline__ scalar_t grad_of(scalar_t zv, acc_t inv_tau, acc_t lse, acc_t a,
                                            acc_t b, acc_t mean_s) {
  const acc_t s = static_cast<acc_t>(zv) * inv_tau;
  const acc_t p = fexp(s - lse);
  // p == 0 (a masked -inf logit, or s - lse below exp's range): exactly 0, as in eager
  // autograd, not 0 * inf = NaN. A NaN p stays NaN.
  return static_cast<scalar_t>(p == acc_t(0) ? acc_t(0) : -p * (a + b * (s - mean_s)));
}

// out may alias z (in-place backward): each element is read before it is written, by the same
// thread; the target element is read into a register before any write.
template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const scalar_t* z, RowIndexer in_rows, scalar_t* out, RowIndexer out_rows,
                    const int64_t* __restrict__ tgt, int64_t N, int64_t V, acc_t inv_tau,
                    int64_t ignore_index, const acc_t* __restrict__ glp,
                    const acc_t* __restrict__ gent, const acc_t* __restrict__ lse_p,
                    const acc_t* __restrict__ ent_p) {
  using V16 = Vec16<scalar_t>;
  constexpr int VEC = V16::kSize;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const int64_t y = tgt[n];
    const scalar_t* row = z + in_rows.offset(n);
    scalar_t* orow = out + out_rows.offset(n);
    if (y == ignore_index) {
      for (int64_t i = threadIdx.x; i < V; i += blockDim.x) orow[i] = scalar_t(0);
      continue;
    }
    if (bad_target(y, n, V, ignore_index)) {
      const scalar_t nan = static_cast<scalar_t>(std::numeric_limits<acc_t>::quiet_NaN());
      for (int64_t i = threadIdx.x; i < V; i += blockDim.x) orow[i] = nan;
      continue;
    }
    const acc_t a = glp[n] * inv_tau;
    const acc_t b = gent ? gent[n] * inv_tau : acc_t(0);
    const acc_t lse = lse_p[n];
    const acc_t mean_s = ent_p ? lse - ent_p[n] : acc_t(0);  // E_p[s] = lse - H
    acc_t s_y = 0;
    if (threadIdx.x == 0) s_y = static_cast<acc_t>(row[y]) * inv_tau;
    __syncthreads();  // s_y is read before anyone overwrites row[y]
    // The loads are vectorised on the input's alignment; the stores too when the output row
    // has the same 16-byte phase (always for a fresh contiguous gradient of a contiguous
    // input), else they are scalar (a strided view such as logits[:, :-1] of an odd V).
    const int64_t head = aligned_head(row, V);
    const bool vec_out = head == aligned_head(orow, V);
    for (int64_t i = threadIdx.x; i < head; i += blockDim.x)
      orow[i] = grad_of(row[i], inv_tau, lse, a, b, mean_s);
    const int64_t nvec = (V - head) / VEC;
    const V16* vin = reinterpret_cast<const V16*>(row + head);
    for (int64_t k = threadIdx.x; k < nvec; k += blockDim.x) {
      V16 v = vin[k];
#pragma unroll
      for (int j = 0; j < VEC; ++j) v.v[j] = grad_of(v.v[j], inv_tau, lse, a, b, mean_s);
      if (vec_out) {
        reinterpret_cast<V16*>(orow + head)[k] = v;
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) orow[head + k * VEC + j] = v.v[j];
      }
    }
    for (int64_t i = head + nvec * VEC + threadIdx.x; i < V; i += blockDim.x)
      orow[i] = grad_of(row[i], inv_tau, lse, a, b, mean_s);
    __syncthreads();  // the loop's value at y is replaced below
    if (threadIdx.x == 0) {
      // A target at a masked column (lp = -inf) gets g_lp / tau, as log_softmax's autograd.
      const acc_t p_y = fexp(s_y - lse);
      const acc_t ent_y = p_y == acc_t(0) ? acc_t(0) : b * p_y * (s_y - mean_s);
      orow[y] = static_cast<scalar_t>(a * (1 - p_y) - ent_y);
    }
  }
}

// `io` comes from token_logprob_op (checks.h), which checked every argument but the ids (the
// kernel checks those).
void forward_into(const LogprobForwardTensors& io, double temperature, int64_t ignore_index,
                  bool compute_entropy) {
  const c10::cuda::CUDAGuard guard(io.logits.device());
  const at::Tensor &logits = io.logits, &target = io.target, &lp = io.logprob, &ent = io.entropy,
                   &lse = io.lse;
  const int64_t V = logits.size(-1);
  const int64_t N = target.numel();
  if (N == 0) return;
  const RowIndexer rows(logits);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "token_logprob_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    auto launch = [&](auto kernel) {
      kernel<<<grid_for(N), kThreads, 0, stream>>>(
          logits.data_ptr<scalar_t>(), rows, target.data_ptr<int64_t>(), N, V,
          static_cast<acc_t>(1.0 / temperature), ignore_index, lp.data_ptr<acc_t>(),
          compute_entropy ? ent.data_ptr<acc_t>() : nullptr, lse.data_ptr<acc_t>());
    };
    if (compute_entropy) launch(forward_kernel<scalar_t, acc_t, true>);
    else launch(forward_kernel<scalar_t, acc_t, false>);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// `in` comes from prepare_logprob_backward (which checked every argument); out may be logits.
void backward_into(const LogprobBackwardInputs& in, const at::Tensor& logits, const at::Tensor& out,
                   double temperature, int64_t ignore_index) {
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t V = logits.size(-1);
  const int64_t N = in.target.numel();
  if (N == 0) return;
  const at::Tensor &target = in.target, &g_lp = in.grad_logprob, &g_ent = in.grad_entropy,
                   &lse = in.lse, &ent = in.entropy;
  const bool has_ent = in.has_entropy;
  const RowIndexer in_rows(logits), out_rows(out);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "token_logprob_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    backward_kernel<scalar_t, acc_t><<<grid_for(N), kThreads, 0, stream>>>(
        logits.data_ptr<scalar_t>(), in_rows, out.data_ptr<scalar_t>(), out_rows,
        target.data_ptr<int64_t>(), N, V, static_cast<acc_t>(1.0 / temperature), ignore_index,
        g_lp.data_ptr<acc_t>(), has_ent ? g_ent.data_ptr<acc_t>() : nullptr,
        lse.data_ptr<acc_t>(), has_ent ? ent.data_ptr<acc_t>() : nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(reasonrl_fast, CUDA, m) {
  m.impl("token_logprob", &token_logprob_op<cuda::forward_into>);
  m.impl("token_logprob_backward", &token_logprob_backward_op<cuda::backward_into>);
  m.impl("token_logprob_backward_", &token_logprob_backward_inplace_op<cuda::backward_into>);
}

}  // namespace reasonrl_fast
