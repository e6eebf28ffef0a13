// CPU kernel of group_advantage (docs/math.md §Group advantage). Group ids are arbitrary integers:
// responses are ordered by (group id, position) once, then each group is a contiguous run.
// Statistics are accumulated in double; B is a few thousand, so one thread is enough.
#include <torch/library.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "checks.h"
#include "common.h"

namespace reasonrl_fast {
namespace {

at::Tensor group_advantage_cpu(const at::Tensor& rewards_in, const at::Tensor& group_ids_in,
                               double eps, bool norm_by_std) {
  check_group_advantage(rewards_in, group_ids_in, eps);
  const int64_t B = rewards_in.size(0);
  const at::Tensor r = rewards_in.to(at::kDouble).contiguous();
  const at::Tensor g = group_ids_in.to(at::kLong).contiguous();
  at::Tensor out = at::empty({B}, rewards_in.options().dtype(at::kFloat));
  if (B == 0) return out;
  const double* rp = r.data_ptr<double>();
  const int64_t* gp = g.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();

  std::vector<int64_t> order(B);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return gp[a] < gp[b]; });

  for (int64_t lo = 0; lo < B;) {
    int64_t hi = lo + 1;
    while (hi < B && gp[order[hi]] == gp[order[lo]]) ++hi;
    const int64_t k = hi - lo;
    double mean = 0, std = 1;  // a group of one: mean 0, std 1 (verl's rule)
    if (k > 1) {
      for (int64_t i = lo; i < hi; ++i) mean += rp[order[i]];
      mean /= static_cast<double>(k);
      // One correction pass: makes the mean exact for equal rewards, so they get exactly 0
      // rather than rounding noise divided by eps.
      double c = 0;
      for (int64_t i = lo; i < hi; ++i) c += rp[order[i]] - mean;
      mean += c / static_cast<double>(k);
      double ss = 0;  // two passes: no cancellation for rewards with a large common offset
      for (int64_t i = lo; i < hi; ++i) ss += (rp[order[i]] - mean) * (rp[order[i]] - mean);
      std = std::sqrt(ss / static_cast<double>(k - 1));  // unbiased, as torch.std
    }
    for (int64_t i = lo; i < hi; ++i) {
      const double a = rp[order[i]] - mean;
      op[order[i]] = static_cast<float>(norm_by_std ? a / (std + eps) : a);
    }
    lo = hi;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(reasonrl_fast, CPU, m) { m.impl("group_advantage", &group_advantage_cpu); }

}  // namespace reasonrl_fast
