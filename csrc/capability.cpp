// The CPU capability in force (capability.h): detected once, overridden by the environment or by
// `set_cpu_capability`.
#include "capability.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>

namespace reasonrl_fast {
namespace {

constexpr const char* kNames[] = {"default", "avx2", "avx512"};
constexpr int kUnset = -1;

std::atomic<int> g_capability{kUnset};

// The widest capability this CPU has (the OS's saved AVX state included: __builtin_cpu_supports
// reads both CPUID and XGETBV, as the ISA levels require).
Capability widest() {
#if defined(RRL_X86_CAPABILITIES)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return Capability::kAVX512;
  if (__builtin_cpu_supports("x86-64-v3")) return Capability::kAVX2;
#endif
  return Capability::kDefault;
}

int parse(const std::string& name) {
  for (int i = 0; i < 3; ++i) {
    if (name == kNames[i]) return i;
  }
  return kUnset;
}

std::string has_list() {
  std::string out;
  for (const auto& n : cpu_capabilities()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

int from_environment() {
  const int top = static_cast<int>(widest());
  if (const char* ours = std::getenv("REASONRL_CPU_CAPABILITY"); ours != nullptr && *ours != '\0') {
    const int c = parse(ours);
    TORCH_CHECK(c != kUnset, "REASONRL_CPU_CAPABILITY=", ours, ": expected one of default, avx2, avx512");
    TORCH_CHECK(c <= top, "REASONRL_CPU_CAPABILITY=", ours, ": this CPU does not have it (it has ", has_list(),
                ")");
    return c;
  }
  if (const char* aten = std::getenv("ATEN_CPU_CAPABILITY"); aten != nullptr) {
    const int c = parse(aten);  // ATen's other names (zvector, vsx, sve256, ...) are not ours
    if (c != kUnset) return c < top ? c : top;
  }
  return top;
}

}  // namespace

Capability cpu_capability() {
  int c = g_capability.load(std::memory_order_relaxed);
  if (c == kUnset) {
    c = from_environment();
    g_capability.store(c, std::memory_order_relaxed);
  }
  return static_cast<Capability>(c);
}

std::vector<std::string> cpu_capabilities() {
  std::vector<std::string> out;
  for (int i = 0; i <= static_cast<int>(widest()); ++i) out.emplace_back(kNames[i]);
  return out;
}

std::string capability_name(Capability c) { return kNames[static_cast<int>(c)]; }

std::string set_cpu_capability(const std::string& name) {
  const int c = parse(name);
  TORCH_CHECK(c != kUnset, "cpu capability '", name, "': expected one of default, avx2, avx512");
  TORCH_CHECK(c <= static_cast<int>(widest()), "cpu capability '", name, "': this CPU does not have it (it has ",
              has_list(), ")");
  const std::string before = capability_name(cpu_capability());
  g_capability.store(c, std::memory_order_relaxed);
  return before;
}

}  // namespace reasonrl_fast
