"""The Triton kernel of group_advantage (reasonrl_fast/ops/triton/group_advantage.py): bitwise
equal to the CPU kernel (torch.ops.reasonrl_fast.group_advantage on CPU tensors) and close to
the float64 reference loop (reasonrl_fast/ops/reference.py).

Where a GPU is present the cases run compiled on it; elsewhere in Triton's interpreter, which
triton.jit picks when a kernel is decorated, so TRITON_INTERPRET=1 must be set before triton is
imported: there the cases skip in this process and run in a fresh child interpreter
(test_in_fresh_process). The interpreter is slow: a few hundred responses at most, small blocks
(16 positions a program) so that groups cross the programs' boundaries. Also: the kernel
compiled ahead of time for sm_80 and sm_90 without a GPU, to check what only the compiler
decides (no fused multiply-add).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

from reasonrl_fast.ops import reference as ref
from tests.helpers.ops import HAS_CUDA, OPS

HAS_TRITON = importlib.util.find_spec("triton") is not None
if HAS_TRITON:
    import triton

    from reasonrl_fast.ops.triton import group_advantage as tk

    # True when TRITON_INTERPRET=1 was set before triton was imported (see the docstring).
    INTERPRETED = type(triton.language.standard._sum_combine).__name__ == "InterpretedFunction"
else:
    INTERPRETED = False

DEVICE = "cuda" if HAS_CUDA else "cpu"
runs_here = pytest.mark.skipif(
    not (HAS_TRITON and (HAS_CUDA or INTERPRETED)),
    reason="needs triton, and a GPU or TRITON_INTERPRET=1 before triton is imported: on CPU "
           "these cases run in test_in_fresh_process")


def triton_ga(r, ids, eps=1e-6, norm_by_std=True, block=16):
    return tk.group_advantage(r.to(DEVICE), ids.to(DEVICE), eps, norm_by_std, block=block).cpu()


def assert_bitwise(got, want):
    """Equal bit for bit where `want` is a number; NaN where it is NaN (a NaN's sign and payload
    are the hardware's: x86 and a GPU write different ones)."""
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), (got, want)
    g, w = got[~nan], want[~nan]
    diff = (g.view(torch.int32) != w.view(torch.int32)).nonzero().flatten()
    assert diff.numel() == 0, f"{diff.numel()} differ, the first: {g[diff[0]]} vs {w[diff[0]]}"


def scattered_batch(B, rdtype, idtype):
    """B rewards (offset by 30: a one-pass variance would cancel) in groups of 1 to 12, the groups
    shuffled over the batch, their ids random over the whole id type: negative, huge, sparse."""
    sizes = []
    while sum(sizes) < B:
        sizes.append(int(torch.randint(1, 13, ())))
    sizes[-1] -= sum(sizes) - B
    info = torch.iinfo(idtype)
    pool = torch.randint(info.min, info.max, (len(sizes),), dtype=torch.int64).unique()
    assert pool.numel() == len(sizes)  # a collision would merge two groups: vanishingly rare
    pool = pool[torch.randperm(len(sizes))]
    ids = torch.repeat_interleave(pool, torch.tensor(sizes))[torch.randperm(B)].to(idtype)
    r = (torch.randn(B, dtype=torch.float64) * 2 + 30).to(rdtype)
    return r, ids


# (B, rewards dtype, ids dtype, eps, norm_by_std, block). bf16 / fp16 rewards offset by 30 are
# coarse: groups of equal rewards arise (exactly 0 out). eps = 0 with float64 rewards, where no
# group of two or more is constant (0 / 0 is compared as NaN anyway). block None: the default.
CASES = [
    (1, torch.float32, torch.int64, 1e-6, True, 16),
    (7, torch.float64, torch.int32, 0.0, True, 16),
    (129, torch.bfloat16, torch.int64, 1e-6, False, 16),
    (200, torch.float16, torch.int64, 1e-6, True, 16),
    (257, torch.float64, torch.int32, 1e-6, True, None),
]


@runs_here
@pytest.mark.parametrize("B,rdtype,idtype,eps,norm_by_std,block", CASES)
def test_bitwise_equal_to_the_cpu_kernel(B, rdtype, idtype, eps, norm_by_std, block):
    r, ids = scattered_batch(B, rdtype, idtype)
    got = triton_ga(r, ids, eps, norm_by_std, block)
    assert_bitwise(got, OPS.group_advantage(r, ids, eps, norm_by_std))
    want = ref.group_advantage(r.double(), ids, eps=eps, norm_by_std=norm_by_std)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5, equal_nan=True)


@runs_here
def test_one_group_across_every_program():
    # One run of 65 that starts in the first program and ends in the fifth, non-contiguous
    # rewards (a strided view) and uint8 ids (widened, as the CPU kernel widens them).
    r = torch.randn(130, dtype=torch.float64)[::2]
    ids = torch.full((65,), 200, dtype=torch.uint8)
    assert_bitwise(triton_ga(r, ids), OPS.group_advantage(r, ids, 1e-6, True))


@runs_here
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide")  # numpy's 0 / 0
def test_equal_rewards_give_exactly_zero():
    # Groups of 8 equal rewards (0.1 and its multiples: their float64 mean rounds). Only the
    # correction pass makes the mean exact: without it r - mean is noise of order 1e-17, which
    # eps = 0 turns into advantages of order 1.
    assert sum([0.1] * 8) / 8 != 0.1  # the premise: the plain mean is off
    g = torch.arange(64) // 8
    g = g[torch.randperm(64)]
    r = 0.1 * (1 + g % 5).double()
    assert (triton_ga(r, g, 1e-6) == 0).all()
    assert triton_ga(r, g, 0.0).isnan().all()  # 0 / (0 + 0), as the CPU kernel gives
    assert (triton_ga(r, g, 1e-6, norm_by_std=False) == 0).all()
    assert_bitwise(triton_ga(r, g, 0.0), OPS.group_advantage(r, g, 0.0, True))


@runs_here
def test_sums_in_index_order():
    # A group whose float64 sums depend on their order (2**53 + 1 rounds back to 2**53),
    # interleaved with another group: the CPU kernel adds in index order, and on the reversed
    # batch in the reverse order, and the two differ. The kernel must give the first.
    r = torch.tensor([1.0, 5.0, 2.0**53, -2.0**53, 7.0, 1.0, 3.0], dtype=torch.float64)
    g = torch.tensor([4, -9, 4, 4, -9, 4, 2**40])
    want = OPS.group_advantage(r, g, 1e-6, True)
    reversed_order = OPS.group_advantage(r.flip(0), g.flip(0), 1e-6, True).flip(0)
    assert not torch.equal(want, reversed_order)  # the premise: the order shows in the output
    assert_bitwise(triton_ga(r, g), want)
    assert_bitwise(triton_ga(r, g, norm_by_std=False), OPS.group_advantage(r, g, 1e-6, False))


@runs_here
def test_eps_is_used_in_float64():
    # A spread far below eps, so the denominator is about eps: eps rounded to float32 (as a
    # Python float reaches a Triton kernel) moves the float32 advantages by about half an ulp.
    g = torch.arange(64) // 4
    r = 1 + torch.rand(64, dtype=torch.float64) * 1e-9
    eps = 0.3
    want = OPS.group_advantage(r, g, eps, True)
    eps32 = float(torch.tensor(eps, dtype=torch.float32))
    assert not torch.equal(want, OPS.group_advantage(r, g, eps32, True))  # the premise
    assert_bitwise(triton_ga(r, g, eps), want)


@runs_here
def test_empty():
    out = tk.group_advantage(torch.zeros(0, device=DEVICE),
                             torch.zeros(0, dtype=torch.long, device=DEVICE))
    assert out.shape == (0,) and out.dtype == torch.float32


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_bad_input_raises_the_ops_errors():
    # Checked before any launch, with the op's messages: no GPU or interpreter needed.
    r, g = torch.randn(4), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="group_ids"):
        tk.group_advantage(r, g[:3])
    with pytest.raises(ValueError, match=r"\[B\]"):
        tk.group_advantage(r[None], g[None])
    with pytest.raises(TypeError, match="integer"):
        tk.group_advantage(r, g.float())
    with pytest.raises(TypeError, match="floating"):
        tk.group_advantage(g, g)
    for eps in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="eps"):
            tk.group_advantage(r, g, eps=eps)
    with pytest.raises(ValueError, match="one device"):
        tk.group_advantage(r, g.to("meta"))


# --- ahead-of-time compilation for sm_80 and sm_90, without a GPU --------------------------------
# Bitwise equality on a GPU needs the compiled code to round as the CPU does: ss + d * d must not
# become an fma. The interpreter (numpy) never fuses; the compiler does unless the launch forbids
# it. triton.compile with an explicit GPUTarget runs the full pipeline down to a cubin with the
# options the host function launches with.


@pytest.mark.heavy  # Triton's full pipeline down to a cubin, about a second per kernel
@pytest.mark.parametrize("arch,rt,it,norm", [(90, "bf16", "i64", True),
                                            (80, "fp64", "i32", True), (90, "fp32", "i64", False)])
def test_kernel_compiles_for_gpu_without_fused_multiply_add(arch, rt, it, norm):
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    if INTERPRETED:
        pytest.skip("kernels are interpreted in this process")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {"ids_ptr": f"*{it}", "order_ptr": "*i64", "r_ptr": f"*{rt}", "out_ptr": "*fp32",
           "B": "i32", "eps_bits": "i64", "NORM_BY_STD": "constexpr", "BLOCK": "constexpr"}
    const = dict(NORM_BY_STD=norm, BLOCK=tk.CUDA_BLOCK)
    src = ASTSource(tk._group_adv_kernel, sig, constexprs=const)
    try:
        k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(tk.CUDA_LAUNCH))
    except (RuntimeError, ImportError) as e:  # no offline CUDA toolchain in this triton
        if "ptxas" in str(e) or "backend" in str(e).lower():
            pytest.skip(f"triton cannot compile for CUDA offline here: {e}")
        raise
    ptx = k.asm["ptx"]
    assert k.asm.get("cubin")
    assert "fma" not in ptx and "approx" not in ptx
    # The products are rounded on their own (mul.rn: ptxas may not contract them either), the
    # divisions and the square root are IEEE-rounded.
    assert re.search(r"div\.rn\.f64", ptx)
    if norm:
        assert re.search(r"mul\.rn\.f64", ptx) and re.search(r"sqrt\.rn\.f64", ptx)


@pytest.mark.proc
@pytest.mark.skipif(not HAS_TRITON or HAS_CUDA or INTERPRETED
                    or bool(os.environ.get("_RRL_SUBPROCESS")),
                    reason="no triton, a GPU runs the cases, or they already run in this process")
def test_in_fresh_process():
    """The kernel cases, in a child interpreter started with TRITON_INTERPRET=1."""
    env = dict(os.environ, TRITON_INTERPRET="1", _RRL_SUBPROCESS="1")
    cases = "not test_in_fresh_process and not compiles_for_gpu and not bad_input"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "no:xdist", __file__, "-k", cases],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert " passed" in last and "skipped" not in last, r.stdout[-2000:]
