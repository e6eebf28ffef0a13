"""CUDA kernels (csrc/kernels/*.cu) against float64 references and the CPU kernels.

Skipped without a GPU (and when the extension was built without CUDA kernels); run in full on
one. Shapes are awkward on purpose: odd N and V (rows that are not 16-byte aligned, so the
scalar head and tail of the vectorised loops are exercised), strided logits, ignored rows.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from reasonrl_fast.ops import group_advantage, masked_mean, tb_loss, token_logprob
from reasonrl_fast.ops import reference as R
from tests.childproc import child_outcomes, run_snippet
from tests.ops.test_token_logprob import _masked_inputs as masked_inputs
from tests.ops.test_token_logprob_direct import _CASES as _DIRECT_CASES
from tests.ops.test_token_logprob_direct import _SETUP as _DIRECT_SETUP
from tests.ops.test_token_logprob_direct import check_cases

_op = torch.ops.reasonrl_fast


def _has_cuda_kernels():
    if not torch.cuda.is_available():
        return False
    try:
        _op.masked_mean(torch.zeros(1, 1, 8, device="cuda"), torch.ones(1, 1, device="cuda"))
        return True
    except (NotImplementedError, RuntimeError):
        return False


pytestmark = pytest.mark.skipif(not _has_cuda_kernels(),
                                reason="needs a GPU and reasonrl_fast built with CUDA kernels")
DEV = "cuda"


@pytest.mark.parametrize("shape,V", [((7,), 1000), ((3, 5), 7), ((1,), 1), ((4, 9), 152064 // 64 + 3),
                                     ((0,), 11)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_token_logprob_forward_backward(shape, V, dtype, tau):
    gen = torch.Generator().manual_seed(0)
    z64 = torch.randn(*shape, V, generator=gen, dtype=torch.float64) * 4
    y = torch.randint(0, V, shape, generator=gen)
    if y.numel() > 1:
        y.view(-1)[1] = -100
    z = z64.to(dtype)
    zc = z.to(DEV).requires_grad_()
    lp, ent = token_logprob(zc, y.to(DEV), temperature=tau, return_entropy=True)
    zr = z.double().requires_grad_()
    rlp, rent = R.token_logprob(zr, y, tau)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(lp.cpu().double(), rlp, **tol)
    torch.testing.assert_close(ent.cpu().double(), rent, **tol)
    g1, g2 = torch.randn(shape, generator=gen, dtype=torch.float64), torch.randn(shape, generator=gen, dtype=torch.float64)
    (gz,) = torch.autograd.grad((lp.double() * g1.to(DEV)).sum() + (ent.double() * g2.to(DEV)).sum(), zc)
    (rz,) = torch.autograd.grad((rlp * g1).sum() + (rent * g2).sum(), zr)
    if dtype == torch.float64:
        torch.testing.assert_close(gz.cpu(), rz, rtol=1e-9, atol=1e-10)
    else:  # the gradient is stored in dtype: compare with the CPU kernel, same rounding rules
        zcpu = z.clone().requires_grad_()
        clp, cent = token_logprob(zcpu, y, temperature=tau, return_entropy=True)
        (cz,) = torch.autograd.grad((clp.double() * g1).sum() + (cent.double() * g2).sum(), zcpu)
        err = (gz.cpu().double() - rz).abs().max().item() if rz.numel() else 0.0
        cerr = (cz.double() - rz).abs().max().item() if rz.numel() else 0.0
        assert err <= 2 * cerr + 1e-6


def test_token_logprob_strided_and_inplace():
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(3, 6, 101, generator=gen).to(torch.bfloat16)
    y = torch.randint(0, 101, (3, 5), generator=gen)
    z = base.to(DEV)[:, :-1]  # strided leading dims, rows start at odd element offsets
    lp = token_logprob(z, y.to(DEV))
    torch.testing.assert_close(lp.cpu(), token_logprob(base[:, :-1], y), rtol=1e-5, atol=1e-5)
    a = base.to(DEV).contiguous()[:, :-1].clone().requires_grad_()
    b = a.detach().clone().requires_grad_()
    token_logprob(a, y.to(DEV)).sum().backward()
    token_logprob(b, y.to(DEV), inplace_backward=True).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def test_token_logprob_opcheck_gradcheck():
    z = torch.randn(4, 37, device=DEV, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([3, -100, 0, 36], device=DEV)
    torch.library.opcheck(_op.token_logprob, (z, y, 0.7, -100, True))
    assert torch.autograd.gradcheck(
        lambda z: token_logprob(z, y, temperature=0.7, return_entropy=True), (z,))


def test_token_logprob_bad_target_is_reported():
    """A bad id fails a device-side assertion, reported at the next synchronisation. It
    poisons the CUDA context, so it runs in a subprocess."""
    code = textwrap.dedent("""
        import torch, reasonrl_fast.ops as o
        z = torch.randn(4, 10, device="cuda")
        lp = o.token_logprob(z, torch.tensor([1, 2, 10, 3], device="cuda"))
        torch.cuda.synchronize()
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "outside the vocabulary" in r.stdout + r.stderr or "device-side assert" in r.stderr


def test_token_logprob_direct_calls_check_every_argument():
    """Sizes, dtypes, devices and temperature of each schema, called directly (the CPU test's
    cases, on CUDA; the out-of-range ids are below, one child each)."""
    check_cases(child_outcomes("DEV = 'cuda'\n" + _DIRECT_CASES, timeout=300))


@pytest.mark.parametrize("schema,bad", [("fwd", "ids(10**12)"), ("fwd", "ids(V)"), ("fwd", "ids(-7)"),
                                        ("fwd", "big_uint"), ("bwd", "ids(V)"), ("bwd", "big_uint"),
                                        ("bwd_", "ids(-7)"), ("bwd_", "ids(10**12)")])
def test_token_logprob_bad_id_fails_at_the_next_sync(schema, bad):
    """An out-of-range id (uint64 ids above the int64 range included) fails a device-side
    assertion, reported at the caller's next synchronisation; the call itself does not
    synchronise, and no result is ever returned as if valid. A device assertion poisons the CUDA
    context, so each case runs in its own child."""
    code = "DEV = 'cuda'\n" + _DIRECT_SETUP + f"""
bad_ids = {bad}
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("error")  # the op must not synchronise to check the ids
def call():
    {schema}(t=bad_ids)
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
print(outcome(call))
"""
    p = run_snippet(code, timeout=300)
    assert p.returncode >= 0, p.stderr[-3000:]  # not killed by a signal
    lines = p.stdout.strip().splitlines()
    # A RuntimeError from the synchronisation (AcceleratorError in newer PyTorch), not one from
    # the sync debug mode (which would mean the op synchronised) nor "no exception".
    assert lines and lines[-1].startswith(("RuntimeError", "AcceleratorError")), p.stdout + p.stderr[-3000:]
    assert "device-side assert" in lines[-1], lines[-1]


def test_token_logprob_uint64_and_int32_ids_without_sync():
    z = torch.randn(6, 300, device=DEV)
    y = torch.randint(0, 300, (6,))
    y64, y32, g = y.to(torch.uint64).to(DEV), y.to(torch.int32).to(DEV), torch.randn(6, device=DEV)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [_op.token_logprob(z, ids, 1.0, -100, True) for ids in (y64, y32)]
        grads = [_op.token_logprob_backward(g, g, z, ids, lse, ent, 1.0, -100)
                 for ids, (_, ent, lse) in zip((y64, y32), outs)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    want = _op.token_logprob(z, y.to(DEV), 1.0, -100, True)
    want_grad = _op.token_logprob_backward(g, g, z, y.to(DEV), want[2], want[1], 1.0, -100)
    for out, grad in zip(outs, grads):
        for a, b in zip(out, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_token_logprob_masked_columns(dtype, with_entropy, tau):
    """-inf columns: gradient exactly 0 there, finite everywhere, eager's elsewhere (within twice
    the CPU kernel's error in low precision, whose own test bounds it by eager's)."""
    torch.manual_seed(3)
    n, v = 11, 1031
    x, y, mask = masked_inputs(n, v, dtype)
    g1 = torch.randn(n, dtype=torch.float64)
    g2 = torch.randn(n, dtype=torch.float64) if with_entropy else torch.zeros(n, dtype=torch.float64)

    def grads(z, ids):
        zc = z.clone().requires_grad_()
        lp, ent = token_logprob(zc, ids, temperature=tau, return_entropy=True)
        (lp.double() * g1.to(z.device) + ent.double() * g2.to(z.device)).sum().backward()
        return [a.detach().cpu().double() for a in (lp, ent, zc.grad)]

    ours = grads(x.to(DEV), y.to(DEV))
    cpu = grads(x, y)
    zr = x.double().requires_grad_()
    rlp, rent = R.token_logprob(zr, y, tau)
    (rlp * g1 + rent * g2).sum().backward()
    exact = [rlp.detach(), rent.detach(), zr.grad]
    assert all(torch.isfinite(a).all() for a in ours)
    assert (ours[2][mask] == 0).all()
    if dtype == torch.float64:
        for o, e in zip(ours, exact):
            torch.testing.assert_close(o, e, rtol=1e-9, atol=1e-10)
        return
    for o, e in zip(ours[:2], exact[:2]):  # float32 accumulation, as the forward test
        torch.testing.assert_close(o, e, rtol=2e-5, atol=2e-5)
    # the gradient is stored in dtype: compare with the CPU kernel's error, same rounding rules
    assert (ours[2] - exact[2]).abs().max().item() <= 2 * (cpu[2] - exact[2]).abs().max().item() + 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprob_dtype_minimum_mask_and_masked_target(dtype):
    torch.manual_seed(4)
    x, y, mask = masked_inputs(9, 257, dtype, fill=torch.finfo(dtype).min)
    y[2] = int(mask[2].nonzero()[0])  # a target at a masked column: lp = -inf, finite gradient
    for tau in (1.0, 0.5):  # at 0.5 the minimum overflows to -inf in float32
        zc = x.to(DEV).clone().requires_grad_()
        lp, ent = token_logprob(zc, y.to(DEV), temperature=tau, return_entropy=True)
        (torch.where(torch.isfinite(lp), lp, 0).sum() + ent.sum()).backward()
        zr = x.clone().requires_grad_()
        lpr, entr = token_logprob(zr, y, temperature=tau, return_entropy=True)
        (torch.where(torch.isfinite(lpr), lpr, 0).sum() + entr.sum()).backward()
        assert torch.isfinite(zc.grad).all()
        other_masked = mask & (torch.arange(257) != y[:, None])
        assert (zc.grad.cpu()[other_masked] == 0).all()
        torch.testing.assert_close(zc.grad.cpu(), zr.grad, rtol=2e-2, atol=1e-5)


def test_token_logprob_masked_lm_head():
    torch.manual_seed(5)
    h, w = torch.randn(13, 16, device=DEV), torch.randn(301, 16, device=DEV) / 4
    mask = torch.zeros(301, device=DEV).masked_fill(torch.rand(301, device=DEV) < 0.2, float("-inf"))
    y = torch.multinomial((mask == 0).float(), 13, replacement=True)

    def run(fn):
        hg, wg = h.clone().requires_grad_(), w.clone().requires_grad_()
        lp, ent = fn(hg @ wg.T + mask, y, 0.9)
        (lp.sum() + ent.sum()).backward()
        return hg.grad, wg.grad

    ours = run(lambda z, t, tau: token_logprob(z, t, temperature=tau, return_entropy=True))
    for a, b in zip(ours, run(R.token_logprob)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_token_logprob_inplace_refusals_and_tiny_temperature():
    leaf = torch.randn(10, device=DEV, requires_grad=True)
    y = torch.tensor([1, 2, 3, 4], device=DEV)
    with pytest.raises(ValueError, match="share memory"):
        token_logprob(leaf.expand(4, 10), y, inplace_backward=True)
    z = torch.randn(1, 10, device=DEV).expand(4, 10)
    lp, ent, lse = _op.token_logprob(z, y, 1.0, -100, False)
    with pytest.raises(ValueError, match="share memory"):
        _op.token_logprob_backward_(lp, None, z, y, lse, ent, 1.0, -100)
    base = torch.randn(4, 10, device=DEV, requires_grad=True)
    zz = base * 1.0
    cubed = zz**3
    out = token_logprob(zz, y, inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (out.sum() + cubed.sum()).backward()
    with pytest.raises(ValueError, match="smallest"):
        token_logprob(torch.randn(4, 10, device=DEV), y, temperature=1e-40)


@pytest.mark.parametrize("B", [1, 7, 1000, 8192, 70000])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_group_advantage(B, norm_by_std):
    gen = torch.Generator().manual_seed(2)
    r = torch.randn(B, generator=gen, dtype=torch.float64) + 100
    g = torch.randint(0, max(1, B // 5), (B,), generator=gen) * 7 - 3
    got = group_advantage(r.to(DEV), g.to(DEV), norm_by_std=norm_by_std)
    want = _op.group_advantage(r, g, 1e-6, norm_by_std)  # CPU kernel
    if B <= 1000:
        torch.testing.assert_close(
            want.double(), R.group_advantage(r, g, norm_by_std=norm_by_std), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
    assert got.dtype == torch.float32


@pytest.mark.parametrize("B", [64, 70000])  # the tiled kernel and the ATen path above kTiledMax
@pytest.mark.parametrize("rdtype", [torch.float64, torch.float32])
def test_group_advantage_equal_rewards(B, rdtype):
    # Groups of 8 equal rewards (0.1, whose mean rounds): the correction pass gives exactly 0,
    # and with eps = 0 exactly 0 / 0 = NaN as on the CPU (not noise / noise, of order 1).
    g = torch.arange(B) // 8
    r = (0.1 * (1 + g % 5).double()).to(rdtype)  # float32 sums of 8 are exact in double
    for eps in (1e-6, 0.0):
        got = group_advantage(r.to(DEV), g.to(DEV), eps=eps).cpu()
        want = _op.group_advantage(r, g, eps, True)
        assert torch.equal(got.isnan(), want.isnan())
        assert (got == 0).all() if eps else got.isnan().all()
        assert (group_advantage(r.to(DEV), g.to(DEV), norm_by_std=False) == 0).all()


def test_group_advantage_opcheck():
    torch.library.opcheck(_op.group_advantage, (torch.randn(9, device=DEV),
                                                torch.tensor([0, 1, 0, 2, 2, 2, 5, 1, 0], device=DEV),
                                                1e-6, True))


@pytest.mark.parametrize("B,T", [(1, 1), (5, 33), (64, 1000)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tb_loss(B, T, dtype):
    gen = torch.Generator().manual_seed(3)
    mk = lambda *s: torch.randn(*s, generator=gen, dtype=dtype) * 0.1  # noqa: E731
    lz, lp, ref, old, rw = mk(B), mk(B, T) - 1, mk(B, T) - 1, mk(B, T) - 1, mk(B)
    mask = torch.rand(B, T, generator=gen) < 0.7
    ins = [t.to(DEV) for t in (lz, lp)]
    ins = [t.requires_grad_() for t in ins]
    loss = tb_loss(ins[0], ins[1], ref.to(DEV), old.to(DEV), rw.to(DEV), mask.to(DEV))
    r_ins = [t.double().requires_grad_() for t in (lz, lp)]
    rloss, _, _ = R.tb_loss(r_ins[0], r_ins[1], ref.double(), old.double(), rw.double(), mask)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss.cpu().double(), rloss, **tol)
    got = torch.autograd.grad(loss, ins)
    want = torch.autograd.grad(rloss, r_ins)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu().double(), b, **tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tb_loss_nan_weight_propagates(dtype):
    # fmin/fmax would clamp a NaN importance weight to a bound, silently dropping the sequence:
    # the weight, the loss and that sequence's gradients must be NaN, as on the CPU.
    gen = torch.Generator().manual_seed(5)
    B, T = 4, 37
    mk = lambda *s: (torch.randn(*s, generator=gen, dtype=torch.float64) * 0.1).to(dtype)  # noqa: E731
    lz, lp, ref, old, rw = mk(B), mk(B, T) - 1, mk(B, T) - 1, mk(B, T) - 1, mk(B)
    mask = torch.rand(B, T, generator=gen) < 0.7
    old[1, 3] = float("nan")
    outs = []
    for dev in ("cpu", DEV):
        ins = [t.detach().to(dev).requires_grad_() for t in (lz, lp)]
        loss, st = tb_loss(ins[0], ins[1], ref.to(dev), old.to(dev), rw.to(dev), mask.to(dev), return_stats=True)
        loss.backward()
        outs.append([t.detach().cpu() for t in (loss, st["delta"], st["is_weight"], ins[0].grad, ins[1].grad)])
    (loss, delta, w, glz, glp), cpu = outs[1], outs[0]
    assert torch.isnan(loss) and torch.isnan(w[1]) and torch.isnan(glz[1]) and torch.isnan(glp[1]).all()
    assert torch.isfinite(delta).all() and torch.isfinite(w[[0, 2, 3]]).all()
    for a, b in zip(outs[1], cpu):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_tb_loss_opcheck():
    B, T = 3, 9
    a = lambda *s: torch.randn(*s, device=DEV, dtype=torch.float64)  # noqa: E731
    torch.library.opcheck(_op.tb_loss, (a(B).requires_grad_(), a(B, T).requires_grad_(), a(B, T),
                                        a(B, T), a(B), torch.ones(B, T, device=DEV), 15.0, 0.0, 10.0))


@pytest.mark.parametrize("B,T,H", [(1, 1, 1), (3, 7, 33), (2, 5, 64), (4, 3, 8)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_masked_mean(B, T, H, dtype):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(B, T, H, generator=gen, dtype=torch.float64).to(dtype)
    mask = torch.rand(B, T, generator=gen) < 0.5
    mask[0] = False  # an empty row: zeros and zero gradient
    xc = x.to(DEV).requires_grad_()
    out = masked_mean(xc, mask.to(DEV))
    ref = R.masked_mean(x.double(), mask)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(out.cpu().double(), ref, **tol)
    torch.testing.assert_close(out.cpu(), masked_mean(x, mask), rtol=1e-5, atol=1e-5)
    g = torch.randn(B, H, generator=gen, dtype=torch.float64).to(dtype)
    (gx,) = torch.autograd.grad(out, xc, g.to(DEV))
    xr = x.double().requires_grad_()
    (rx,) = torch.autograd.grad(R.masked_mean(xr, mask), xr, g.double())
    torch.testing.assert_close(gx.cpu().double(), rx, **tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_masked_mean_weights_summing_to_zero(dtype):
    # A row whose weights sum to 0 has no mean: 0 and zero gradient, as on the CPU.
    x = torch.randn(3, 4, 8, dtype=torch.float64).to(dtype)
    w = torch.tensor([[1.0, -1.0, 0.0, 0.0], [2.0, -1.0, 0.5, -1.5], [1.0, 2.0, 0.0, 1.0]])
    xc = x.to(DEV).requires_grad_()
    out = masked_mean(xc, w.to(DEV))
    g = torch.randn(3, 8, dtype=torch.float64).to(dtype)
    (gx,) = torch.autograd.grad(out, xc, g.to(DEV))
    assert (out[:2] == 0).all() and (gx[:2] == 0).all()
    xcpu = x.clone().requires_grad_()
    ocpu = masked_mean(xcpu, w)
    (gcpu,) = torch.autograd.grad(ocpu, xcpu, g)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5  # float32 rounding may flip a bf16 rounding
    torch.testing.assert_close(out.cpu(), ocpu, rtol=tol, atol=tol)
    torch.testing.assert_close(gx.cpu(), gcpu, rtol=tol, atol=tol)


def test_direct_kernel_calls_reject_bad_input():
    # The CUDA kernels check sizes, dtypes and devices themselves: a mismatch raises the
    # promised Python exception, never an illegal memory access (hence the child process).
    lines = child_outcomes("""
        c = lambda *s, dt=torch.float32: torch.rand(*s).to("cuda", dt)
        B, T = 3, 4
        fwd = [c(B), c(B, T), c(B, T), c(B, T), c(B), torch.ones(B, T, dtype=torch.bool, device="cuda")]
        bwd = [c(), c(B), c(B), c(B, T)]
        big = torch.ones(20_000_000, 1, dtype=torch.bool, device="cuda")
        def tb(i, t):
            a = list(fwd)
            a[i] = t
            return ops.tb_loss(*a, 15.0, 0.0, 10.0)
        def tbb(i, t):
            a = list(bwd)
            a[i] = t
            return ops.tb_loss_backward(*a)
        cases = [("no exception", lambda: tb(0, fwd[0])), ("no exception", lambda: tbb(0, bwd[0]))]
        for i, t in enumerate(fwd):
            cases += [("ValueError", lambda i=i, t=t: tb(i, t.cpu())),
                      ("ValueError", lambda i=i, t=t: tb(i, t[:-1]))]
        cases += [("TypeError", lambda: tb(1, c(B, T, dt=torch.long))),
                  ("ValueError", lambda: tb(5, big))]
        for i, t in enumerate(bwd):
            cases += [("ValueError", lambda i=i, t=t: tbb(i, t.cpu())),
                      ("ValueError", lambda i=i, t=t: tbb(i, t[None]))]
        cases += [("TypeError", lambda: tbb(1, c(B, dt=torch.long))),
                  ("ValueError", lambda: ops.tb_loss_backward(c(), c(1), c(1), big)),
                  ("ValueError", lambda: ops.tb_loss_backward(c(), c(1), c(2), c(1, 5)))]
        x, m, g = c(B, T, 8), c(B, T), c(B, 8)
        cases += [("no exception", lambda: ops.masked_mean(x, m)),
                  ("ValueError", lambda: ops.masked_mean(x, m.cpu())),
                  ("ValueError", lambda: ops.masked_mean(x.cpu(), m)),
                  ("ValueError", lambda: ops.masked_mean(x, m[:, :-1])),
                  ("ValueError", lambda: ops.masked_mean(x[:1, :1], big)),
                  ("TypeError", lambda: ops.masked_mean(x.long(), m)),
                  ("no exception", lambda: ops.masked_mean_backward(g, m)),
                  ("ValueError", lambda: ops.masked_mean_backward(g, m.cpu())),
                  ("ValueError", lambda: ops.masked_mean_backward(g[:-1], m)),
                  ("ValueError", lambda: ops.masked_mean_backward(g[:1], big)),
                  ("TypeError", lambda: ops.masked_mean_backward(g.long(), m))]
        r, ids = c(B), torch.arange(B, device="cuda")
        cases += [("no exception", lambda: ops.group_advantage(r, ids, 1e-6, True)),
                  ("ValueError", lambda: ops.group_advantage(r, ids.cpu(), 1e-6, True)),
                  ("ValueError", lambda: ops.group_advantage(r, ids[:-1], 1e-6, True)),
                  ("TypeError", lambda: ops.group_advantage(r, ids.float(), 1e-6, True))]
        for want, fn in cases:
            print(want + "|" + outcome(fn))
        torch.cuda.synchronize()
    """)
    assert len(lines) == 42
    for line in lines:
        want, got = line.split("|", 1)
        assert got.split(":")[0] == want, line


def test_masked_mean_opcheck_gradcheck():
    x = torch.randn(2, 5, 9, device=DEV, dtype=torch.float64, requires_grad=True)
    m = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], device=DEV)
    torch.library.opcheck(_op.masked_mean, (x, m))
    assert torch.autograd.gradcheck(lambda x: masked_mean(x, m), (x,))


def test_current_stream_is_used():
    s = torch.cuda.Stream()
    z = torch.randn(64, 5003, device=DEV)
    y = torch.randint(0, 5003, (64,), device=DEV)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        lp = token_logprob(z, y)
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(lp.cpu(), token_logprob(z.cpu(), y.cpu()), rtol=1e-5, atol=1e-5)
