"""The CPU kernels' loops at each CPU capability (csrc/capability.h: default, avx2, avx512), each
forced in turn: every C++ op against its float64 reference on fresh inputs of awkward sizes,
float32 to the ops' tolerance and bf16 within twice plain PyTorch's error; a capability this CPU
lacks skips, naming it. The capability in force follows REASONRL_CPU_CAPABILITY (`make
test-all` reruns tests/ops under each narrower one), ATen's ATEN_CPU_CAPABILITY capped at what
the CPU has, and is refused in one line where it names nothing or what the CPU lacks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from reasonrl_fast import ops
from reasonrl_fast.config import ConfigError
from reasonrl_fast.ops import reference as ref
from tests.helpers.train import ROOT, repo_env

NAMES = ["default", "avx2", "avx512"]
HAS = ops.cpu_capabilities()
WIDEST = HAS[-1]
CAPS = [pytest.param(c, marks=pytest.mark.skipif(c not in HAS, reason=f"this CPU lacks {c} (it has {', '.join(HAS)})"))
        for c in NAMES]


def _err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def test_the_capability_in_force_is_the_environments_or_the_widest():
    assert HAS[0] == "default" and HAS == NAMES[:len(HAS)]
    assert ops.cpu_capability() == (os.environ.get("REASONRL_CPU_CAPABILITY") or WIDEST)


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprob_at_each_capability(cap, dtype):
    g = torch.Generator().manual_seed(NAMES.index(cap) * 10 + (dtype == torch.float32))
    n, v = 37, 3001  # a partial block and a tail that no vector width divides
    x = (torch.randn(n, v, generator=g, dtype=torch.float64) * 3).to(dtype)
    t = torch.randint(0, v, (n,), generator=g)
    t[5] = -100
    gl, ge = torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, generator=g, dtype=torch.float64)
    x64 = x.double().requires_grad_()
    lp_r, ent_r = ref.token_logprob(x64, t, 0.7)
    ((lp_r * gl).sum() + (ent_r * ge).sum()).backward()
    with ops.capability(cap):
        assert ops.cpu_capability() == cap
        xo = x.clone().requires_grad_()
        lp, ent = ops.token_logprob(xo, t, temperature=0.7, return_entropy=True)
        ((lp * gl.float()).sum() + (ent * ge.float()).sum()).backward()
    if dtype == torch.float32:
        for ours, exact in ((lp, lp_r), (ent, ent_r), (xo.grad, x64.grad)):
            torch.testing.assert_close(ours.double(), exact.detach(), rtol=2e-5, atol=2e-5)
        return
    xp = x.clone().requires_grad_()  # plain PyTorch in bf16
    s = torch.log_softmax(xp / 0.7, -1)
    lp_p = s.gather(-1, t.clamp(min=0)[:, None]).squeeze(-1).masked_fill(t == -100, 0)
    ent_p = -(s.exp() * s).sum(-1).masked_fill(t == -100, 0)
    ((lp_p * gl.to(dtype)).sum() + (ent_p * ge.to(dtype)).sum()).backward()
    for ours, plain, exact in ((lp, lp_p, lp_r), (ent, ent_p, ent_r), (xo.grad, xp.grad, x64.grad)):
        assert _err(ours, exact.detach()) <= 2 * _err(plain, exact.detach()), cap


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tb_loss_at_each_capability(cap, dtype):
    g = torch.Generator().manual_seed(100 + NAMES.index(cap))
    b, t = 7, 1037  # chunks of 512 and a tail
    lz, rw = (torch.randn(b, generator=g, dtype=torch.float64) for _ in range(2))
    lp, rl, ol = (torch.randn(b, t, generator=g, dtype=torch.float64) * 0.1 for _ in range(3))
    mask = (torch.rand(b, t, generator=g) < 0.7).double()
    args64 = [a.clone().requires_grad_() for a in (lz, lp)]
    loss_r = ref.tb_loss(args64[0], args64[1], rl, ol, rw, mask, 15.0, 0.0, 10.0)[0]
    loss_r.backward()
    with ops.capability(cap):
        ours = [a.to(dtype).requires_grad_() for a in (lz, lp)]
        loss = ops.tb_loss(ours[0], ours[1], rl.to(dtype), ol.to(dtype), rw.to(dtype), mask.to(dtype), beta=15.0,
                           max_is_weight=10.0)
        loss.backward()
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(loss.double(), loss_r.detach(), **tol)
    for o, r in zip(ours, args64):
        torch.testing.assert_close(o.grad.double(), r.grad, **tol)


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_mean_at_each_capability(cap, dtype):
    g = torch.Generator().manual_seed(200 + NAMES.index(cap))
    x = torch.randn(5, 13, 67, generator=g, dtype=torch.float64).to(dtype)  # H = 67: a tail at every width
    mask = (torch.rand(5, 13, generator=g) < 0.5).to(torch.float64)
    mask[2] = 0  # an empty row: 0 and no gradient
    w = torch.randn(5, 67, generator=g, dtype=torch.float64)
    x64 = x.double().requires_grad_()
    (ref.masked_mean(x64, mask) * w).sum().backward()
    with ops.capability(cap):
        xo = x.clone().requires_grad_()
        out = ops.masked_mean(xo, mask)
        (out.double() * w).sum().backward()
    exact = ref.masked_mean(x.double(), mask)
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), exact, rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(xo.grad.double(), x64.grad, rtol=2e-5, atol=2e-5)
        return
    xp = x.clone().requires_grad_()  # plain PyTorch in bf16
    plain = (xp * mask.to(dtype)[..., None]).sum(1) / mask.sum(1).clamp(min=1).to(dtype)[:, None]
    assert _err(out, exact) <= 2 * _err(plain, exact), cap


def test_a_capability_this_cpu_lacks_or_none_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^cpu capability 'avx9': expected one of default, avx2, avx512$"):
        ops.set_cpu_capability("avx9")
    assert ops.cpu_capability() == (os.environ.get("REASONRL_CPU_CAPABILITY") or WIDEST)  # unchanged
    if WIDEST != "avx512":
        with pytest.raises(ConfigError, match=r"this CPU does not have it \(it has default"):
            ops.set_cpu_capability("avx512")


@pytest.mark.proc
def test_the_environment_forces_it_and_a_bad_value_stops_the_import():
    code = "import reasonrl_fast.ops as o; print(o.cpu_capability())"

    def run(**env):
        clean = {k: v for k, v in repo_env().items() if k not in ("REASONRL_CPU_CAPABILITY", "ATEN_CPU_CAPABILITY")}
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True,
                              text=True, timeout=120)

    assert run(REASONRL_CPU_CAPABILITY="default").stdout.strip() == "default"
    assert run(ATEN_CPU_CAPABILITY="default").stdout.strip() == "default"
    assert run(ATEN_CPU_CAPABILITY="avx512").stdout.strip() == WIDEST  # ATen's: capped at the CPU's
    assert run(ATEN_CPU_CAPABILITY="zvector").stdout.strip() == WIDEST  # another platform's name
    assert run(REASONRL_CPU_CAPABILITY="avx2", ATEN_CPU_CAPABILITY="default").stdout.strip() == (
        "avx2" if "avx2" in HAS else "")  # ours wins
    bad = run(REASONRL_CPU_CAPABILITY="sse4")
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].endswith(
        "ConfigError: REASONRL_CPU_CAPABILITY=sse4: expected one of default, avx2, avx512"), bad.stderr[-2000:]


@pytest.mark.parametrize("cap", CAPS)
def test_a_bf16_gradient_is_rounded_as_torch_rounds(cap):
    """The bf16 backward's gradient at each capability is, bit for bit, what torch's
    .to(bfloat16) makes of the float32 gradient of the same logits: the same float32 math
    whatever the vector width, rounded to nearest even; values near float32's largest, exact
    zeros and NaN rows included."""
    g = torch.Generator().manual_seed(300 + NAMES.index(cap))
    n, v = 9, 2053
    x = (torch.randn(n, v, generator=g) * 4).bfloat16()
    x[1, 7] = float("nan")  # a NaN row: its gradient is NaN
    x[2, :100] = float("-inf")  # masked columns: exactly 0
    t = torch.randint(100, v, (n,), generator=g)
    glp = torch.randn(n, generator=g) * torch.tensor([1.0, 1e38]).repeat(5)[:n]  # some near float32's largest
    gent = torch.randn(n, generator=g)
    with ops.capability(cap):
        outs = {}
        for dt in (torch.bfloat16, torch.float32):
            z = x.to(dt)
            _, ent, lse = torch.ops.reasonrl_fast.token_logprob(z, t, 0.9, -100, True)
            outs[dt] = torch.ops.reasonrl_fast.token_logprob_backward(glp, gent, z, t, lse, ent, 0.9, -100)
    ours, want = outs[torch.bfloat16], outs[torch.float32].to(torch.bfloat16)
    assert torch.isnan(want).any() and (want == 0).any() and (want.abs() > 1e37).any()
    same = (ours.view(torch.int16) == want.view(torch.int16)) | (ours.isnan() & want.isnan())
    assert bool(same.all()), (cap, int((~same).sum()))
