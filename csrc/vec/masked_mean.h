// The loop of masked_mean's CPU kernel (csrc/masked_mean.cpp): a weighted row added to the sum.
// Compiled once per CPU capability by capabilities.h (no include guard), in namespace RRL_CAP with
// the target attribute RRL_TARGET; the op picks one with RRL_PICK.

namespace RRL_CAP {

template <typename scalar_t, typename acc_t>
RRL_TARGET void accumulate(acc_t* acc, const scalar_t* x, acc_t m, int64_t H) {
#pragma omp simd
  for (int64_t h = 0; h < H; ++h) acc[h] += static_cast<acc_t>(x[h]) * m;
}

}  // namespace RRL_CAP
