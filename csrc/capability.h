// The CPU capability the kernels' inner loops run at, chosen at run time as ATen chooses its
// CPU_CAPABILITY builds: each loop in csrc/vec/ is compiled once per capability (capabilities.h),
// and the op picks the one of the capability in force (`pick`, RRL_PICK).
//
//   default  the baseline instruction set of the target (x86-64: SSE2; aarch64: NEON)
//   avx2     x86-64-v3: AVX2, FMA, BMI2, F16C (Haswell, Zen 1 and later)
//   avx512   x86-64-v4: AVX-512 F, BW, CD, DQ, VL (Skylake-X, Ice Lake, Sapphire Rapids, Zen 4)
//
// In force: REASONRL_CPU_CAPABILITY when set (an error where it names one this CPU lacks or none
// at all), else ATen's own ATEN_CPU_CAPABILITY when it names one of these (capped at what this CPU
// has, as ATen caps it), else the widest this CPU has. `set_cpu_capability` changes it for the
// process (tests and benchmarks run every op under each one).
#pragma once

#include <string>
#include <vector>

namespace reasonrl_fast {

enum class Capability : int { kDefault = 0, kAVX2 = 1, kAVX512 = 2 };

// The capability in force (read from the environment at the first call).
Capability cpu_capability();
// The capabilities this CPU has, narrowest first.
std::vector<std::string> cpu_capabilities();
std::string capability_name(Capability c);
// Forces `name` for this process (an error naming the problem where this CPU lacks it or the
// name is unknown); returns the name of the one in force before.
std::string set_cpu_capability(const std::string& name);

// The function of the capability in force out of one per build.
template <typename F>
F pick(F at_default, F at_avx2, F at_avx512) {
  switch (cpu_capability()) {
    case Capability::kAVX512: return at_avx512;
    case Capability::kAVX2: return at_avx2;
    default: return at_default;
  }
}

}  // namespace reasonrl_fast

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RRL_X86_CAPABILITIES 1
// RRL_PICK(fn<T, U>): `fn` of the capability in force, out of cap_default::, cap_avx2:: and
// cap_avx512:: (template arguments with commas pass through __VA_ARGS__ whole).
#define RRL_PICK(...) \
  ::reasonrl_fast::pick(cap_default::__VA_ARGS__, cap_avx2::__VA_ARGS__, cap_avx512::__VA_ARGS__)
#else
#define RRL_PICK(...) (cap_default::__VA_ARGS__)
#endif
