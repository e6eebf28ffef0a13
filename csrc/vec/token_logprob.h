// The row loops of token_logprob's CPU kernels (csrc/token_logprob.cpp): a row's log-prob, entropy and
// log-sum-exp, and its gradient.
// Compiled once per CPU capability by capabilities.h (no include guard), in namespace RRL_CAP with
// the target attribute RRL_TARGET; the op picks one with RRL_PICK.

namespace RRL_CAP {

template <typename scalar_t, typename acc_t>
RRL_TARGET void forward_row(const scalar_t* z, int64_t V, acc_t inv_tau, int64_t y, bool want_entropy,
                            acc_t* lp, acc_t* ent, acc_t* lse) {
  constexpr acc_t kInf = std::numeric_limits<acc_t>::infinity();
  acc_t buf[kBlock];
  acc_t m = -kInf;  // running max of s
  acc_t S = 0;      // sum exp(s - m)
  acc_t E = 0;      // sum exp(s - m) * (s - m): entropy without cancellation
  int bad = 0;      // a NaN or +inf logit: the row is NaN, as in PyTorch
  for (int64_t start = 0; start < V; start += kBlock) {
    const int64_t len = std::min(kBlock, V - start);
    const scalar_t* zb = z + start;
    acc_t bm = -kInf;
#pragma omp simd reduction(max : bm) reduction(| : bad)
    for (int64_t i = 0; i < len; ++i) {
      const acc_t s = static_cast<acc_t>(zb[i]) * inv_tau;
      buf[i] = s;
      bm = s > bm ? s : bm;
      bad |= !(s < kInf);
    }
    if (bm > m) {
      if (S > 0) {
        // r = 0 (the old maximum is dtype-minimum-like, e.g. a mask filled with finfo.min): the
        // old terms vanish. Computed, (m - bm) * S overflows to -inf and 0 * -inf is NaN.
        const acc_t r = std::exp(m - bm);
        E = r > acc_t(0) ? r * (E + (m - bm) * S) : acc_t(0);
        S = r * S;
      }
      m = bm;
    }
    if (m == -kInf) continue;  // all -inf so far: nothing to add
    acc_t bs = 0, be = 0;
    if (want_entropy) {
#pragma omp simd reduction(+ : bs, be)
      for (int64_t i = 0; i < len; ++i) {
        acc_t d = buf[i] - m;
        d = d < exp_floor<acc_t>() ? exp_floor<acc_t>() : d;
        const acc_t e = fast_exp(d);
        bs += e;
        be += e * d;
      }
    } else {
#pragma omp simd reduction(+ : bs)
      for (int64_t i = 0; i < len; ++i) bs += fast_exp(buf[i] - m);
    }
    S += bs;
    E += be;
  }
  const acc_t nan = std::numeric_limits<acc_t>::quiet_NaN();
  const acc_t log_s = std::log(S);
  *lse = bad ? nan : m + log_s;
  *lp = static_cast<acc_t>(z[y]) * inv_tau - *lse;
  if (want_entropy) *ent = bad ? nan : log_s - E / S;
}

template <typename scalar_t, typename acc_t>
RRL_TARGET void backward_row(const scalar_t* z, scalar_t* dz, int64_t V, acc_t inv_tau,
                             int64_t y, acc_t g_lp, acc_t g_ent, acc_t lse, acc_t mean_s) {
  // dz_j = (g_lp (1[j = y] - p_j) - g_ent p_j (s_j - E_p[s])) / tau; the 1[j = y] term is
  // added after the loop, in acc_t, so the loop has no branch. Where p_j underflows to 0
  // (s_j - lse below exp_floor: a masked -inf logit, or one so negative that s_j itself
  // overflowed to -inf) dz_j is exactly 0, as in eager autograd: a select, never 0 * inf.
  constexpr acc_t kFloor = exp_floor<acc_t>();
  const acc_t a = g_lp * inv_tau, b = g_ent * inv_tau;
  const acc_t s_y = static_cast<acc_t>(z[y]) * inv_tau;
  acc_t buf[kBlock];
  for (int64_t start = 0; start < V; start += kBlock) {
    const int64_t len = std::min(kBlock, V - start);
    const scalar_t* zb = z + start;
    scalar_t* dzb = dz + start;
    // Two loops: the float math vectorises on its own; the conversion to a 16-bit dtype
    // (with its rounding branch) would stop it if fused.
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      const acc_t s = static_cast<acc_t>(zb[i]) * inv_tau;
      const acc_t d = s - lse;
      const acc_t g = -fast_exp(d) * (a + b * (s - mean_s));
      buf[i] = d < kFloor ? acc_t(0) : g;  // NaN stays NaN: the comparison is false
    }
    for (int64_t i = 0; i < len; ++i) dzb[i] = static_cast<scalar_t>(buf[i]);
  }
  // A target at a masked column (s_y = -inf, lp = -inf) gets g_lp / tau, as log_softmax's
  // autograd gives it.
  const acc_t d_y = s_y - lse;
  const acc_t p_y = d_y < kFloor ? acc_t(0) : fast_exp(d_y);
  const acc_t ent_y = p_y == 0 ? acc_t(0) : b * p_y * (s_y - mean_s);
  dz[y] = static_cast<scalar_t>(a * (1 - p_y) - ent_y);
}

}  // namespace RRL_CAP
