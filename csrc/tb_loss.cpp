// CPU kernels of the FlowRL trajectory-balance loss (docs/math.md §FlowRL trajectory balance): one
// pass over the four [B, T] inputs per sequence, parallel over sequences; the batch mean is summed
// in order so the result does not depend on the thread count.
#include <torch/library.h>

#include "checks.h"
#include "common.h"

namespace reasonrl_fast {
namespace {

constexpr double kLenEps = 1e-8;  // n + 1e-8, as in verl
constexpr int64_t kChunk = 512;   // summed in the input precision, vectorised; chunks in double

#define RRL_VEC "vec/tb_loss.h"
#include "capabilities.h"
#undef RRL_VEC

template <typename scalar_t>
double row_sum(const scalar_t* m, int64_t T,
               void (*sums)(const scalar_t*, const scalar_t*, const scalar_t*, const scalar_t*, int64_t, double&,
                            double&, double&, double&)) {
  double n, unused;
  sums(m, m, m, m, T, n, unused, unused, unused);
  return n;
}

// `io` comes from tb_loss_op (checks.h): checked, converted, outputs allocated, B > 0.
void tb_loss_into(const TbLossTensors& io, double beta, double min_w, double max_w) {
  const int64_t B = io.logprob.size(0), T = io.logprob.size(1);
  const at::Tensor &lz = io.log_z, &lp = io.logprob, &ref = io.ref_logprob, &old = io.old_logprob,
                   &rw = io.reward, &mk = io.mask, &loss = io.loss, &delta = io.delta,
                   &w = io.weight;
  const auto dt = lp.scalar_type();
  AT_DISPATCH_FLOATING_TYPES(dt, "tb_loss", [&] {
    const scalar_t *lz_p = lz.data_ptr<scalar_t>(), *lp_p = lp.data_ptr<scalar_t>(),
                   *ref_p = ref.data_ptr<scalar_t>(), *old_p = old.data_ptr<scalar_t>(),
                   *rw_p = rw.data_ptr<scalar_t>(), *mk_p = mk.data_ptr<scalar_t>();
    scalar_t *d_p = delta.data_ptr<scalar_t>(), *w_p = w.data_ptr<scalar_t>();
    const auto row_sums = RRL_PICK(row_sums<scalar_t>);
    at::parallel_for(0, B, std::max<int64_t>(1, 16384 / std::max<int64_t>(T, 1)), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        double n, s_lp, s_ref, s_ratio;
        row_sums(lp_p + b * T, ref_p + b * T, old_p + b * T, mk_p + b * T, T, n, s_lp, s_ref, s_ratio);
        const double denom = n + kLenEps;
        d_p[b] = static_cast<scalar_t>(lz_p[b] + s_lp / denom - beta * rw_p[b] - s_ref / denom);
        w_p[b] = static_cast<scalar_t>(std::min(std::max(std::exp(s_ratio), min_w), max_w));
      }
    });
    double total = 0;
    for (int64_t b = 0; b < B; ++b) total += double(w_p[b]) * d_p[b] * d_p[b];
    loss.fill_(total / static_cast<double>(B));
  });
}

// `io` comes from tb_loss_backward_op (checks.h): checked, converted, outputs allocated, B > 0.
void tb_loss_backward_into(const TbLossBackwardTensors& io) {
  const int64_t B = io.mask.size(0), T = io.mask.size(1);
  const at::Tensor &g_lz = io.grad_log_z, &g_lp = io.grad_logprob;
  AT_DISPATCH_FLOATING_TYPES(io.delta.scalar_type(), "tb_loss_backward", [&] {
    const double g = io.grad_loss.item<double>();
    const scalar_t *d_p = io.delta.data_ptr<scalar_t>(), *w_p = io.weight.data_ptr<scalar_t>(),
                   *m_p = io.mask.data_ptr<scalar_t>();
    scalar_t *glz = g_lz.data_ptr<scalar_t>(), *glp = g_lp.data_ptr<scalar_t>();
    const auto row_sums = RRL_PICK(row_sums<scalar_t>);
    const auto scale_row = RRL_PICK(scale_row<scalar_t>);
    at::parallel_for(0, B, std::max<int64_t>(1, 16384 / std::max<int64_t>(T, 1)), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const scalar_t* m = m_p + b * T;
        const double n = row_sum(m, T, row_sums);
        const double c = g * 2.0 * double(w_p[b]) * d_p[b] / static_cast<double>(B);
        glz[b] = static_cast<scalar_t>(c);
        const double ct = c / (n + kLenEps);
        scalar_t* out = glp + b * T;
        scale_row(out, m, static_cast<scalar_t>(ct), T);
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(reasonrl_fast, CPU, m) {
  m.impl("tb_loss", &tb_loss_op<tb_loss_into>);
  m.impl("tb_loss_backward", &tb_loss_backward_op<tb_loss_backward_into>);
}

}  // namespace reasonrl_fast
