// CPU kernels of masked_mean, the prompt pooling of the Z-head (docs/math.md §Masked mean): out[b]
// = sum_t x[b, t] m[b, t] / sum_t m[b, t], 0 (and zero gradient) where sum_t m[b, t] == 0 (an empty
// mask, or weights that cancel such as [1, -1]: no mean exists), accumulated in float32.
#include <torch/library.h>

#include <vector>

#include "checks.h"
#include "common.h"

namespace reasonrl_fast {
namespace {


#define RRL_VEC "vec/masked_mean.h"
#include "capabilities.h"
#undef RRL_VEC

at::Tensor masked_mean_cpu(const at::Tensor& x_in, const at::Tensor& mask_in) {
  check_masked_mean(x_in, mask_in);
  const at::Tensor x = x_in.contiguous();
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2);
  at::Tensor out = at::empty({B, H}, x.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "masked_mean", [&] {
    using acc_t = acc_type_t<scalar_t>;
    const at::Tensor mask = mask_in.to(c10::CppTypeToScalarType<acc_t>::value).contiguous();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const acc_t* mp = mask.data_ptr<acc_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const auto accumulate = RRL_PICK(accumulate<scalar_t, acc_t>);
    at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      std::vector<acc_t> acc(H);
      for (int64_t b = b0; b < b1; ++b) {
        std::fill(acc.begin(), acc.end(), acc_t(0));
        acc_t n = 0;
        for (int64_t t = 0; t < T; ++t) {
          const acc_t m = mp[b * T + t];
          if (m == 0) continue;  // prompts are short next to T: skip padding rows outright
          n += m;
          accumulate(acc.data(), xp + (b * T + t) * H, m, H);
        }
        const acc_t inv = n != 0 ? acc_t(1) / n : acc_t(0);
        for (int64_t h = 0; h < H; ++h) op[b * H + h] = static_cast<scalar_t>(acc[h] * inv);
      }
    });
  });
  return out;
}

at::Tensor masked_mean_backward_cpu(const at::Tensor& grad_in, const at::Tensor& mask_in) {
  check_masked_mean_backward(grad_in, mask_in);
  const at::Tensor grad = grad_in.contiguous();
  const int64_t B = mask_in.size(0), T = mask_in.size(1), H = grad.size(1);
  at::Tensor out = at::empty({B, T, H}, grad.options());
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(), "masked_mean_backward", [&] {
    using acc_t = acc_type_t<scalar_t>;
    const at::Tensor mask = mask_in.to(c10::CppTypeToScalarType<acc_t>::value).contiguous();
    const scalar_t* gp = grad.data_ptr<scalar_t>();
    const acc_t* mp = mask.data_ptr<acc_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        acc_t n = 0;
        for (int64_t t = 0; t < T; ++t) n += mp[b * T + t];
        const acc_t inv = n != 0 ? acc_t(1) / n : acc_t(0);
        for (int64_t t = 0; t < T; ++t) {
          const acc_t c = mp[b * T + t] * inv;
          scalar_t* o = op + (b * T + t) * H;
          const scalar_t* g = gp + b * H;
          for (int64_t h = 0; h < H; ++h) o[h] = static_cast<scalar_t>(static_cast<acc_t>(g[h]) * c);
        }
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(reasonrl_fast, CPU, m) {
  m.impl("masked_mean", &masked_mean_cpu);
  m.impl("masked_mean_backward", &masked_mean_backward_cpu);
}

}  // namespace reasonrl_fast
