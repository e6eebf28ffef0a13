// Compiles the loops of the header named by RRL_VEC (csrc/vec/*.h) once per CPU capability, each
// in a namespace of its own (cap_default, cap_avx2, cap_avx512) with the target attribute of its
// instruction set: the same source, vectorised by GCC at each width. Include it where the loops
// are used, inside the op's namespace, after defining RRL_VEC; RRL_PICK (capability.h) then
// chooses among them. The helpers the loops call (common.h: fast_exp, ...) are inline functions
// of the default target, which GCC inlines into each wider one.
//
// No include guard: each op includes it with its own RRL_VEC.

#define RRL_CAP cap_default
#define RRL_TARGET
#include RRL_VEC
#undef RRL_CAP
#undef RRL_TARGET

#if defined(RRL_X86_CAPABILITIES)
#define RRL_CAP cap_avx2
#define RRL_TARGET __attribute__((target("arch=x86-64-v3")))
#include RRL_VEC
#undef RRL_CAP
#undef RRL_TARGET

#define RRL_CAP cap_avx512
#define RRL_TARGET __attribute__((target("arch=x86-64-v4")))
#include RRL_VEC
#undef RRL_CAP
#undef RRL_TARGET
#endif
