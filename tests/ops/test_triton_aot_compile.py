"""Ahead-of-time compilation of the Triton kernels for sm_80 and sm_90, without a GPU.

The interpreter does not check what only the compiler checks (dtype rules of tl.dot, shared
memory, register allocation); triton.compile with an explicit GPUTarget runs the full
pipeline down to a cubin (ptxas ships in triton's wheel), so a kernel that would not compile
on an A100/H100 fails here. Skipped when this triton cannot compile for CUDA offline, or when
the interpreter is on in this process (kernels decorated as interpreted functions).
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

import importlib  # noqa: E402

tk = importlib.import_module("reasonrl_fast.ops.triton.linear_logprob")

if type(tk._fwd_kernel).__name__ != "JITFunction":
    pytest.skip("kernels are interpreted in this process", allow_module_level=True)

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

_T = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
      torch.float64: "fp64"}
_ACC = {torch.bfloat16: "fp32", torch.float16: "fp32", torch.float32: "fp32",
        torch.float64: "fp64"}


def _configs(dtype, arch):
    """The autotuning candidates: all 16-bit ones for sm_90 (the H100/H200 case), else the
    first of each list (the one that must also fit an A100). Each compile takes seconds."""
    key = dtype if dtype in (torch.float32, torch.float64) else "16bit"
    configs = tk._CONFIGS[key]
    return configs if arch == 90 and key == "16bit" else configs[:1]


# Shared memory a block may use: A100 163 KiB, H100/H200 227 KiB.
_SHARED = {80: 163 * 1024, 90: 227 * 1024}


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_kernels_compile_for_gpu(arch, dtype):
    t, a = _T[dtype], _ACC[dtype]
    ACC, PREC = tk._types(dtype, torch.device("cuda"))
    for cfg in _configs(dtype, arch):
        _compile_both(arch, t, a, ACC, PREC, dict(cfg.kwargs),
                      dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))


def _compile_both(arch, t, a, ACC, PREC, consts, opts):
    consts["UPCAST"] = False
    sig = {"h_ptr": f"*{t}", "w_ptr": f"*{t}", "b_ptr": f"*{t}", "y_ptr": "*i64",
           "m_ptr": f"*{a}", "s_ptr": f"*{a}", "e_ptr": f"*{a}", "t_ptr": f"*{a}",
           "N": "i32", "V": "i32", "H": "i32", "stride_hn": "i32", "stride_wv": "i32",
           "tau_ptr": f"*{a}", "N_BUCKET": "i32",
           "HAS_BIAS": "constexpr", "ACC": "constexpr", "PREC": "constexpr",
           "UPCAST": "constexpr", "BLOCK_N": "constexpr", "BLOCK_V": "constexpr",
           "BLOCK_H": "constexpr"}
    const = dict(HAS_BIAS=True, ACC=ACC, PREC=PREC, **consts)
    src = ASTSource(tk._fwd_kernel, sig, constexprs=const)
    try:
        k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)
    except (RuntimeError, ImportError) as e:  # no offline CUDA toolchain in this triton
        if "ptxas" in str(e) or "backend" in str(e).lower():
            pytest.skip(f"triton cannot compile for CUDA offline here: {e}")
        raise
    assert k.asm.get("cubin")
    sig2 = {"h_ptr": f"*{t}", "w_ptr": f"*{t}", "b_ptr": f"*{t}", "y_ptr": "*i64",
            "glp_ptr": f"*{a}", "gent_ptr": f"*{a}", "lse_ptr": f"*{a}", "mean_ptr": f"*{a}",
            "dz_ptr": f"*{t}", "N": "i32", "V": "i32", "H": "i32", "c0": "i32", "c1": "i32",
            "stride_hn": "i32", "stride_wv": "i32", "stride_dz": "i32", "tau_ptr": f"*{a}",
            "ignore_index": "i64", "N_BUCKET": "i32", "HAS_BIAS": "constexpr",
            "HAS_ENT": "constexpr", "ACC": "constexpr", "PREC": "constexpr", "UPCAST": "constexpr",
            "BLOCK_N": "constexpr", "BLOCK_V": "constexpr", "BLOCK_H": "constexpr"}
    const2 = dict(HAS_BIAS=True, HAS_ENT=True, ACC=ACC, PREC=PREC, **consts)
    src2 = ASTSource(tk._dz_kernel, sig2, constexprs=const2)
    k2 = triton.compile(src2, target=GPUTarget("cuda", arch, 32), options=opts)
    assert k2.asm.get("cubin")
    limit = _SHARED[arch]
    assert k.metadata.shared <= limit and k2.metadata.shared <= limit, (consts, opts)
