// CPU kernels of token_logprob (docs/math.md §Token log-prob and entropy): one pass over each row
// of logits in forward (block-wise online max and sum: every block is read from memory once and
// re-read from L1), one pass in backward. No float32 copy of the logits is ever made.
#include <torch/library.h>

#include "checks.h"
#include "common.h"

namespace reasonrl_fast {
namespace {

constexpr int64_t kBlock = 1024;  // 4 KiB of float32 per block: stays in L1.

#define RRL_VEC "vec/token_logprob.h"
#include "capabilities.h"
#undef RRL_VEC

// Every id in [0, V) or ignore_index, checked before any row is read. `target` is the
// caller's tensor, `ids` its int64 copy (target_as_long, which already turned uint64 ids above
// the int64 range into INT64_MAX or INT64_MAX - 1: out of range, so one loop catches them).
void check_targets(const at::Tensor& target, const at::Tensor& ids, int64_t V,
                   int64_t ignore_index) {
  const bool wide = target.scalar_type() == at::kUInt64;
  const int64_t* t = ids.data_ptr<int64_t>();
  const int64_t N = ids.numel();
  for (int64_t n = 0; n < N; ++n) {
    TORCH_CHECK_INDEX(t[n] == ignore_index || (t[n] >= 0 && t[n] < V), "token_logprob: target id ",
                      t[n], " at flat position ", n,
                      wide && t[n] >= std::numeric_limits<int64_t>::max() - 1
                          ? " (a uint64 id at or above the int64 range)" : "",
                      " is outside the vocabulary [0, ", V, ") and is not ignore_index (",
                      ignore_index, ")");
  }
}

// `io` comes from token_logprob_op (checks.h), which checked every argument but the ids.
void forward_into(const LogprobForwardTensors& io, double temperature, int64_t ignore_index,
                  bool compute_entropy) {
  const at::Tensor &logits = io.logits, &target = io.target, &lp = io.logprob, &ent = io.entropy,
                   &lse = io.lse;
  const int64_t V = logits.size(-1);
  const int64_t N = target.numel();
  check_targets(io.target_arg, target, V, ignore_index);
  if (N == 0) return;

  const RowIndexer rows(logits);
  const int64_t* t = target.data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(1, 65536 / V);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "token_logprob", [&] {
    using acc_t = acc_type_t<scalar_t>;
    const scalar_t* z = logits.data_ptr<scalar_t>();
    acc_t* lp_p = lp.data_ptr<acc_t>();
    acc_t* ent_p = compute_entropy ? ent.data_ptr<acc_t>() : nullptr;
    acc_t* lse_p = lse.data_ptr<acc_t>();
    const acc_t inv_tau = static_cast<acc_t>(1.0 / temperature);
    const auto forward_row = RRL_PICK(forward_row<scalar_t, acc_t>);
    at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        if (t[n] == ignore_index) {
          lp_p[n] = 0;
          lse_p[n] = 0;
          if (ent_p) ent_p[n] = 0;
          continue;
        }
        acc_t e;
        forward_row(z + rows.offset(n), V, inv_tau, t[n], compute_entropy,
                                     lp_p + n, ent_p ? ent_p + n : &e, lse_p + n);
      }
    });
  });
}

// `in` comes from prepare_logprob_backward (which checked every argument); out may be logits.
void backward_into(const LogprobBackwardInputs& in, const at::Tensor& logits, const at::Tensor& out,
                   double temperature, int64_t ignore_index) {
  const int64_t V = logits.size(-1);
  const int64_t N = in.target.numel();
  check_targets(in.target_arg, in.target, V, ignore_index);
  if (N == 0) return;
  const at::Tensor &target = in.target, &g_lp = in.grad_logprob, &g_ent = in.grad_entropy,
                   &lse = in.lse, &ent = in.entropy;
  const bool has_ent = in.has_entropy;
  const RowIndexer in_rows(logits), out_rows(out);
  const int64_t* t = target.data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(V, 1));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "token_logprob_backward", [&] {
    using acc_t = acc_type_t<scalar_t>;
    const scalar_t* z = logits.data_ptr<scalar_t>();
    scalar_t* dz = out.data_ptr<scalar_t>();
    const acc_t* glp = g_lp.data_ptr<acc_t>();
    const acc_t* gent = has_ent ? g_ent.data_ptr<acc_t>() : nullptr;
    const acc_t* lse_p = lse.data_ptr<acc_t>();
    const acc_t* ent_p = has_ent ? ent.data_ptr<acc_t>() : nullptr;
    const acc_t inv_tau = static_cast<acc_t>(1.0 / temperature);
    const auto backward_row = RRL_PICK(backward_row<scalar_t, acc_t>);
    at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        scalar_t* row_out = dz + out_rows.offset(n);
        if (t[n] == ignore_index) {
          std::fill(row_out, row_out + V, scalar_t(0));
          continue;
        }
        const acc_t ge = gent ? gent[n] : acc_t(0);
        const acc_t mean_s = ent_p ? lse_p[n] - ent_p[n] : acc_t(0);  // E_p[s] = lse - H
        backward_row(z + in_rows.offset(n), row_out, V, inv_tau, t[n], glp[n], ge,
                                      lse_p[n], mean_s);
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(reasonrl_fast, CPU, m) {
  m.impl("token_logprob", &token_logprob_op<forward_into>);
  m.impl("token_logprob_backward", &token_logprob_backward_op<backward_into>);
  m.impl("token_logprob_backward_", &token_logprob_backward_inplace_op<backward_into>);
}

}  // namespace reasonrl_fast
