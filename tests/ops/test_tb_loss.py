"""tb_loss against the float64 reference, on every device (DEVICES); the math is in
docs/math.md §FlowRL trajectory balance."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reasonrl_fast.ops import reference as ref
from reasonrl_fast.ops import tb_loss
from tests.helpers.childproc import child_outcomes
from tests.helpers.ops import DEVICES, OPS, assert_no_recompile, check_typed_outcomes, cuda_only, opcheck


def _inputs(b, t, dtype=torch.float64, empty_rows=()):
    lp = -torch.rand(b, t, dtype=torch.float64) * 3
    refl = -torch.rand(b, t, dtype=torch.float64) * 3
    old = lp + torch.randn(b, t, dtype=torch.float64) * 0.05
    lens = torch.randint(1, t + 1, (b,))
    mask = (torch.arange(t)[None, :] < lens[:, None]).double()
    for r in empty_rows:
        mask[r] = 0
    log_z = torch.randn(b, dtype=torch.float64)
    reward = torch.randn(b, dtype=torch.float64)
    return [x.to(dtype) for x in (log_z, lp, refl, old, reward)] + [mask]


def _compare(args, rtol, beta=15.0, lo=0.0, hi=10.0, is_clip_eps=None):
    log_z, lp, refl, old, reward, mask = args
    a = [log_z.clone().requires_grad_(), lp.clone().requires_grad_()]
    kw = dict(beta=beta, max_is_weight=hi) if is_clip_eps is None else dict(beta=beta, is_clip_eps=is_clip_eps)
    loss, stats = tb_loss(a[0], a[1], refl, old, reward, mask, return_stats=True, **kw)
    g = torch.rand(())
    (loss * g).backward()
    r = [log_z.double().requires_grad_(), lp.double().requires_grad_()]
    loss_r, delta_r, w_r = ref.tb_loss(r[0], r[1], refl.double(), old.double(), reward.double(), mask, beta, lo, hi)
    (loss_r * g.double()).backward()
    torch.testing.assert_close(loss.double(), loss_r, rtol=rtol, atol=rtol)
    torch.testing.assert_close(stats["delta"].double(), delta_r, rtol=rtol, atol=rtol)
    torch.testing.assert_close(stats["is_weight"].double(), w_r, rtol=rtol, atol=rtol)
    torch.testing.assert_close(a[0].grad.double(), r[0].grad, rtol=rtol, atol=rtol)
    torch.testing.assert_close(a[1].grad.double(), r[1].grad, rtol=rtol, atol=rtol)
    return a


@pytest.mark.parametrize("bt", [(1, 1), (7, 13), (33, 257)])
def test_matches_reference_float64(bt):
    _compare(_inputs(*bt), rtol=1e-10)


def test_float32_and_paper_clip_variant():
    _compare([x.float() for x in _inputs(9, 100)], rtol=1e-4)
    _compare(_inputs(9, 100), rtol=1e-10, lo=0.8, hi=1.2, is_clip_eps=0.2)


def test_weight_is_capped_and_gets_no_gradient():
    log_z, lp, refl, old, reward, mask = _inputs(4, 50)
    old = lp - 5.0  # log-ratio sum >= 5 > log(10) even for one token: the weight sits at the cap
    _, stats = tb_loss(log_z, lp, refl, old, reward, mask, return_stats=True)
    assert (stats["is_weight"] == 10.0).all()
    assert not stats["is_weight"].requires_grad


def test_bfloat16_within_twice_plain_pytorch():
    args = _inputs(16, 200)
    low = [x.to(torch.bfloat16) for x in args[:5]] + [args[5]]
    exact, _, _ = ref.tb_loss(*[x.double() for x in low[:5]], args[5])
    plain, _, _ = ref.tb_loss(*low)  # plain PyTorch in bf16
    ours = tb_loss(*low)
    assert abs(ours.double() - exact) <= 2 * abs(plain.double() - exact) + 1e-12


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 6), t=st.integers(1, 9), data=st.data())
def test_property_empty_mask_rows(b, t, data):
    empty = data.draw(st.lists(st.integers(0, b - 1), max_size=b, unique=True))
    a = _compare(_inputs(b, t, empty_rows=empty), rtol=1e-9)
    for r in empty:  # an empty row: delta = log_z - beta r, no gradient to its tokens
        assert (a[1].grad[r] == 0).all()


def test_empty_batch():
    loss = tb_loss(*_inputs(0, 5))
    assert loss.shape == () and torch.isnan(loss)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    log_z, lp, refl, old, reward, mask = [x.to(device) for x in _inputs(5, 7)]
    # The weight is a stop-gradient of exp(sum(lp - old)): finite differences would see it
    # move. Put every row at the cap (exp(5) > 10 even for a one-token row), where it is
    # locally constant.
    old = lp - 5.0
    assert torch.autograd.gradcheck(
        lambda z, l: tb_loss(z, l, refl, old, reward, mask, beta=2.0),
        (log_z.requires_grad_(), lp.requires_grad_()),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck(device, dtype):
    log_z, lp, refl, old, reward, mask = [x.to(device, dtype) for x in _inputs(6, 11)]
    opcheck(OPS.tb_loss, (log_z.requires_grad_(), lp.requires_grad_(), refl, old, reward, mask, 15.0, 0.0, 10.0))
    _, delta, w = OPS.tb_loss(log_z, lp, refl, old, reward, mask, 15.0, 0.0, 10.0)
    opcheck(OPS.tb_loss_backward, (torch.tensor(1.0, device=device, dtype=dtype), delta, w, mask))
    B, T = 3, 9
    a = lambda *s: torch.randn(*s, device=device, dtype=torch.float64)  # noqa: E731
    opcheck(OPS.tb_loss, (a(B).requires_grad_(), a(B, T).requires_grad_(), a(B, T), a(B, T), a(B),
                          torch.ones(B, T, device=device), 15.0, 0.0, 10.0))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_dynamic_does_not_recompile(device):
    def mk(n):
        return [x.float().to(device) for x in _inputs(n, 7)]

    assert_no_recompile(lambda *a: tb_loss(*a, return_stats=True)[1]["delta"] * 3, mk)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,T", [(1, 1), (5, 33), (64, 1000)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_reference_awkward_sizes(device, B, T, dtype):
    mk = lambda *s: torch.randn(*s, dtype=dtype) * 0.1  # noqa: E731
    lz, lp, refl, old, rw = mk(B), mk(B, T) - 1, mk(B, T) - 1, mk(B, T) - 1, mk(B)
    mask = torch.rand(B, T) < 0.7
    ins = [t.to(device).requires_grad_() for t in (lz, lp)]
    loss = tb_loss(ins[0], ins[1], refl.to(device), old.to(device), rw.to(device), mask.to(device))
    r_ins = [t.double().requires_grad_() for t in (lz, lp)]
    rloss, _, _ = ref.tb_loss(r_ins[0], r_ins[1], refl.double(), old.double(), rw.double(), mask)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss.cpu().double(), rloss, **tol)
    for a, b in zip(torch.autograd.grad(loss, ins), torch.autograd.grad(rloss, r_ins)):
        torch.testing.assert_close(a.cpu().double(), b, **tol)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_nan_weight_propagates_as_on_the_cpu(dtype):
    # fmin/fmax would clamp a NaN importance weight to a bound, silently dropping the sequence:
    # the weight, the loss and that sequence's gradients must be NaN, as on the CPU.
    B, T = 4, 37
    mk = lambda *s: (torch.randn(*s, dtype=torch.float64) * 0.1).to(dtype)  # noqa: E731
    lz, lp, refl, old, rw = mk(B), mk(B, T) - 1, mk(B, T) - 1, mk(B, T) - 1, mk(B)
    mask = torch.rand(B, T) < 0.7
    old[1, 3] = float("nan")
    outs = []
    for dev in ("cpu", "cuda"):
        ins = [t.detach().to(dev).requires_grad_() for t in (lz, lp)]
        loss, st = tb_loss(ins[0], ins[1], refl.to(dev), old.to(dev), rw.to(dev), mask.to(dev), return_stats=True)
        loss.backward()
        outs.append([t.detach().cpu() for t in (loss, st["delta"], st["is_weight"], ins[0].grad, ins[1].grad)])
    (loss, delta, w, glz, glp), cpu = outs[1], outs[0]
    assert torch.isnan(loss) and torch.isnan(w[1]) and torch.isnan(glz[1]) and torch.isnan(glp[1]).all()
    assert torch.isfinite(delta).all() and torch.isfinite(w[[0, 2, 3]]).all()
    for a, b in zip(outs[1], cpu):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_compile_aot_eager_gradients():
    log_z, lp, refl, old, reward, mask = [x.float() for x in _inputs(6, 11)]
    f = torch.compile(lambda *a: tb_loss(*a) * 3, fullgraph=True, backend="aot_eager")
    z1, l1 = log_z.detach().clone().requires_grad_(), lp.detach().clone().requires_grad_()
    f(z1, l1, refl, old, reward, mask).backward()
    z2, l2 = log_z.detach().clone().requires_grad_(), lp.detach().clone().requires_grad_()
    (tb_loss(z2, l2, refl, old, reward, mask) * 3).backward()
    torch.testing.assert_close(z1.grad, z2.grad)
    torch.testing.assert_close(l1.grad, l2.grad)


def test_bool_mask():
    args = _inputs(5, 9)
    torch.testing.assert_close(tb_loss(*args[:5], args[5].bool()), tb_loss(*args))


class TestBadInput:
    def test_mask_shape(self):
        a = _inputs(3, 4)
        with pytest.raises(ValueError, match="response_mask"):
            tb_loss(*a[:5], a[5][:, :3])

    def test_log_z_shape(self):
        a = _inputs(3, 4)
        with pytest.raises(ValueError, match="log_z"):
            tb_loss(a[0][:2], *a[1:])

    def test_1d_logprob(self):
        a = _inputs(3, 4)
        with pytest.raises(ValueError, match=r"\[B, T\]"):
            tb_loss(a[0], a[1][0], *a[2:])

    def test_bad_weights(self):
        a = _inputs(3, 4)
        with pytest.raises(ValueError, match="max_is_weight"):
            tb_loss(*a, max_is_weight=0.0)
        with pytest.raises(ValueError, match="is_clip_eps"):
            tb_loss(*a, is_clip_eps=1.5)

    def test_integer_logprob(self):
        a = _inputs(3, 4)
        with pytest.raises(TypeError, match="floating"):
            tb_loss(a[0], a[1].long(), *a[2:])


@pytest.mark.proc
def test_direct_kernel_calls_reject_bad_input():
    # torch.ops.reasonrl_fast.* skip the Python wrapper: the kernels must check every tensor
    # argument themselves. In a child process, since the unchecked backward read out of bounds
    # (a [1] delta with a [2e7, 1] mask ended in SIGSEGV). Each line: expected type | outcome.
    lines = child_outcomes("""
        B, T = 3, 4
        f = lambda *s, dt=torch.float32: torch.rand(s).to(dt)
        fwd = dict(log_z=f(B), logprob=f(B, T), ref_logprob=f(B, T), old_logprob=f(B, T),
                   reward=f(B), mask=torch.ones(B, T, dtype=torch.bool))
        def call_fwd(lo=0.0, hi=10.0, **bad):
            return ops.tb_loss(*{**fwd, **bad}.values(), 15.0, lo, hi)
        bwd = dict(grad_loss=torch.tensor(1.0), delta=f(B), is_weight=f(B), mask=torch.ones(B, T))
        def call_bwd(**bad):
            return ops.tb_loss_backward(*{**bwd, **bad}.values())
        big_mask = torch.ones(20_000_000, 1, dtype=torch.bool)
        cases = [
            ("no exception", call_fwd), ("no exception", call_bwd),
            ("ValueError", lambda: call_fwd(log_z=f(B + 1))),
            ("ValueError", lambda: call_fwd(log_z=f(B, 1))),
            ("ValueError", lambda: call_fwd(logprob=f(B))),
            ("ValueError", lambda: call_fwd(logprob=f(B, T + 1))),
            ("ValueError", lambda: call_fwd(ref_logprob=f(B, T - 1))),
            ("ValueError", lambda: call_fwd(old_logprob=f(B + 1, T))),
            ("ValueError", lambda: call_fwd(reward=f(B - 1))),
            ("ValueError", lambda: call_fwd(mask=torch.ones(B, T + 1))),
            ("ValueError", lambda: call_fwd(mask=big_mask)),
            ("ValueError", lambda: call_fwd(lo=2.0, hi=1.0)),
            ("TypeError", lambda: call_fwd(log_z=f(B, dt=torch.long))),
            ("TypeError", lambda: call_fwd(logprob=f(B, T, dt=torch.int32))),
            ("TypeError", lambda: call_fwd(ref_logprob=f(B, T, dt=torch.long))),
            ("TypeError", lambda: call_fwd(old_logprob=f(B, T, dt=torch.bool))),
            ("TypeError", lambda: call_fwd(reward=f(B, dt=torch.long))),
            ("TypeError", lambda: call_fwd(mask=f(B, T, dt=torch.complex64))),
            ("ValueError", lambda: call_fwd(reward=f(B).to("meta"))),
            ("ValueError", lambda: call_bwd(grad_loss=f(2))),
            ("ValueError", lambda: call_bwd(grad_loss=f(0))),
            ("ValueError", lambda: call_bwd(delta=f(1), is_weight=f(1), mask=big_mask)),
            ("ValueError", lambda: call_bwd(delta=f(1), is_weight=f(1))),
            ("ValueError", lambda: call_bwd(delta=f(B, 1))),
            ("ValueError", lambda: call_bwd(is_weight=f(B - 1))),
            ("ValueError", lambda: call_bwd(is_weight=f(B + 1))),
            ("ValueError", lambda: call_bwd(mask=torch.ones(B + 1, T))),
            ("ValueError", lambda: call_bwd(mask=torch.ones(B))),
            ("TypeError", lambda: call_bwd(grad_loss=torch.tensor(1))),
            ("TypeError", lambda: call_bwd(delta=f(B, dt=torch.long))),
            ("TypeError", lambda: call_bwd(delta=f(B, dt=torch.bfloat16))),
            ("TypeError", lambda: call_bwd(is_weight=f(B, dt=torch.long))),
            ("TypeError", lambda: call_bwd(mask=f(B, T, dt=torch.complex64))),
            ("ValueError", lambda: call_bwd(mask=torch.ones(B, T, device="meta"))),
        ]
        for want, fn in cases:
            print(want + "|" + outcome(fn))
    """)
    assert len(lines) == 34
    for line in lines:
        want, got = line.split("|", 1)
        assert got.split(":")[0] == want, line


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("masked_out", [False, True])
def test_nan_old_logprob_makes_its_weight_and_the_loss_nan(masked_out, dtype):
    # A NaN importance weight must not be clamped into [min, max] (fmin/fmax would do that):
    # the sequence would silently drop out of, or be capped in, the loss. As in the reference,
    # it is NaN, and so are the loss and that sequence's gradients (NaN * 0 at masked tokens).
    log_z, lp, refl, old, reward, mask = _inputs(4, 6, dtype)
    mask[1] = 1
    mask[1, 5] = 0
    old[1, 5 if masked_out else 2] = float("nan")
    a = [log_z.clone().requires_grad_(), lp.clone().requires_grad_()]
    loss, stats = tb_loss(a[0], a[1], refl, old, reward, mask, return_stats=True)
    loss.backward()
    r = [log_z.clone().requires_grad_(), lp.clone().requires_grad_()]
    loss_r, delta_r, w_r = ref.tb_loss(r[0], r[1], refl, old, reward, mask)
    loss_r.backward()
    assert torch.isnan(loss) and torch.isnan(stats["is_weight"][1])
    assert torch.isfinite(stats["delta"]).all()
    assert torch.isnan(a[0].grad[1]) and torch.isnan(a[1].grad[1]).all()
    keep = [0, 2, 3]
    assert torch.isfinite(a[1].grad[keep]).all()
    torch.testing.assert_close(stats["is_weight"], w_r, equal_nan=True)
    torch.testing.assert_close(a[0].grad, r[0].grad, equal_nan=True)
    torch.testing.assert_close(a[1].grad, r[1].grad, equal_nan=True)


@pytest.mark.proc
@cuda_only
def test_direct_kernel_calls_reject_bad_input_cuda():
    # The CUDA kernels check sizes, dtypes and devices themselves: a mismatch raises the
    # promised Python exception, never an illegal memory access (hence the child process).
    lines = child_outcomes("""
        c = lambda *s, dt=torch.float32: torch.rand(s).to("cuda", dt)
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
        for want, fn in cases:
            print(want + "|" + outcome(fn))
        torch.cuda.synchronize()
    """)
    check_typed_outcomes(lines, 27)
