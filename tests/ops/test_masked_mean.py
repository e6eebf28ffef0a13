"""masked_mean and ZHead against the float64 reference, on every device (DEVICES); the math is in
docs/math.md §Masked mean and §Z-head."""

import pytest
import torch

from reasonrl_fast.ops import ZHead, masked_mean
from reasonrl_fast.ops import reference as ref
from tests.helpers.childproc import child_outcomes
from tests.helpers.ops import (DEVICES, OPS, assert_no_recompile, check_typed_outcomes, cuda_only, gradcheck,
                              opcheck)


def _inputs(b, t, h, dtype=torch.float64):
    x = torch.randn(b, t, h, dtype=torch.float64).to(dtype)
    mask = torch.rand(b, t) < 0.6
    mask[0] = False  # an empty row
    return x, mask


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bth", [(1, 1, 1), (5, 7, 13), (3, 130, 257)])
def test_matches_reference(device, bth):
    x, mask = (a.to(device) for a in _inputs(*bth))
    xg = x.clone().requires_grad_()
    out = masked_mean(xg, mask)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    xr = x.clone().requires_grad_()
    out_r = ref.masked_mean(xr, mask)
    (out_r * g).sum().backward()
    torch.testing.assert_close(out, out_r)
    torch.testing.assert_close(xg.grad, xr.grad)
    assert (out[0] == 0).all() and (xg.grad[0] == 0).all()


def test_float_weights_mask():
    x = torch.randn(4, 6, 5, dtype=torch.float64)
    w = torch.rand(4, 6, dtype=torch.float64)
    torch.testing.assert_close(masked_mean(x, w), ref.masked_mean(x, w))


def test_bfloat16_within_twice_plain_pytorch():
    x, mask = _inputs(8, 300, 64, dtype=torch.bfloat16)
    exact = ref.masked_mean(x.double(), mask)
    plain = ref.masked_mean(x, mask)
    ours = masked_mean(x, mask)
    assert ours.dtype == torch.bfloat16
    assert (ours.double() - exact).abs().max() <= 2 * (plain.double() - exact).abs().max()


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_opcheck(device):
    x, mask = (a.to(device) for a in _inputs(3, 4, 5))
    gradcheck(lambda a: masked_mean(a, mask), (x.requires_grad_(),))
    xf = x.detach().float().requires_grad_()
    opcheck(OPS.masked_mean, (xf, mask))
    opcheck(OPS.masked_mean_backward, (torch.randn(3, 5, device=device), mask))
    x = torch.randn(2, 5, 9, device=device, dtype=torch.float64, requires_grad=True)
    m = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0]], device=device)  # integer weights, an empty row
    opcheck(OPS.masked_mean, (x, m))
    gradcheck(lambda x: masked_mean(x, m), (x,))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_dynamic_does_not_recompile(device):
    assert_no_recompile(lambda x, m: masked_mean(x, m) * 2,
                        lambda n: (torch.randn(n, 4, 6, device=device), torch.rand(n, 4, device=device) < 0.5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,T,H", [(1, 1, 1), (3, 7, 33), (2, 5, 64), (4, 3, 8)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_matches_reference_awkward_sizes(device, B, T, H, dtype):
    x = torch.randn(B, T, H, dtype=torch.float64).to(dtype)
    mask = torch.rand(B, T) < 0.5
    mask[0] = False  # an empty row: zeros and zero gradient
    xc = x.to(device).requires_grad_()
    out = masked_mean(xc, mask.to(device))
    want = ref.masked_mean(x.double(), mask)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(out.cpu().double(), want, **tol)
    torch.testing.assert_close(out.cpu(), masked_mean(x, mask), rtol=1e-5, atol=1e-5)  # the CPU kernel
    g = torch.randn(B, H, dtype=torch.float64).to(dtype)
    (gx,) = torch.autograd.grad(out, xc, g.to(device))
    xr = x.double().requires_grad_()
    (rx,) = torch.autograd.grad(ref.masked_mean(xr, mask), xr, g.double())
    torch.testing.assert_close(gx.cpu().double(), rx, **tol)
    assert (gx[0] == 0).all()


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_weights_summing_to_zero_match_the_cpu_kernel(dtype):
    # A row whose weights sum to 0 has no mean: 0 and zero gradient, as on the CPU.
    x = torch.randn(3, 4, 8, dtype=torch.float64).to(dtype)
    w = torch.tensor([[1.0, -1.0, 0.0, 0.0], [2.0, -1.0, 0.5, -1.5], [1.0, 2.0, 0.0, 1.0]])
    xc = x.to("cuda").requires_grad_()
    out = masked_mean(xc, w.to("cuda"))
    g = torch.randn(3, 8, dtype=torch.float64).to(dtype)
    (gx,) = torch.autograd.grad(out, xc, g.to("cuda"))
    assert (out[:2] == 0).all() and (gx[:2] == 0).all()
    xcpu = x.clone().requires_grad_()
    ocpu = masked_mean(xcpu, w)
    (gcpu,) = torch.autograd.grad(ocpu, xcpu, g)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5  # float32 rounding may flip a bf16 rounding
    torch.testing.assert_close(out.cpu(), ocpu, rtol=tol, atol=tol)
    torch.testing.assert_close(gx.cpu(), gcpu, rtol=tol, atol=tol)


def test_compile_aot_eager_gradients():
    x, mask = _inputs(3, 4, 5)
    xf = x.float().requires_grad_()
    f = torch.compile(lambda a, m: masked_mean(a, m).square().sum(), fullgraph=True, backend="aot_eager")
    a = xf.detach().clone().requires_grad_()
    f(a, mask).backward()
    masked_mean(xf, mask).square().sum().backward()
    torch.testing.assert_close(a.grad, xf.grad)


def test_empty_and_bad_input():
    assert masked_mean(torch.randn(0, 3, 4), torch.ones(0, 3)).shape == (0, 4)
    with pytest.raises(ValueError, match="mask"):
        masked_mean(torch.randn(2, 3, 4), torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"\[B, T, H\]"):
        masked_mean(torch.randn(2, 3), torch.ones(2, 3))
    with pytest.raises(TypeError, match="floating"):
        masked_mean(torch.ones(2, 3, 4, dtype=torch.long), torch.ones(2, 3))


def test_zhead_layout_and_gradients_reach_the_backbone():
    head = ZHead(16, num_layers=3, dropout=0.1)
    keys = list(head.state_dict())
    assert keys == [
        "net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias",
        "net.4.weight", "net.4.bias", "net.6.weight", "net.6.bias",
        "net.8.weight", "net.8.bias",
    ]
    assert head.net[8].weight.shape == (1, 16)
    head.eval()
    h = torch.randn(3, 5, 16, requires_grad=True)
    prompt = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [0, 1, 1, 0, 0]])
    log_z = head(h, prompt)
    assert log_z.shape == (3,)
    # Same as the head applied to the reference pooling
    torch.testing.assert_close(log_z, head.net(ref.masked_mean(h, prompt)).squeeze(-1))
    log_z.sum().backward()
    assert h.grad is not None and (h.grad[0, :2] != 0).any() and (h.grad[0, 2:] == 0).all()


def test_zhead_loads_reference_checkpoint_names():
    src = ZHead(8, num_layers=2)
    proj_z = {f"proj_z.{k}": v for k, v in src.state_dict().items()}  # as verl's FlowRL saves them
    dst = ZHead(8, num_layers=2)
    dst.load_state_dict({k.removeprefix("proj_z."): v for k, v in proj_z.items()})
    for a, b in zip(src.parameters(), dst.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError):
        ZHead(0)


def test_weights_summing_to_zero_give_zero_and_no_gradient():
    # Such a row has no mean (dividing by 0): it is treated like an empty mask, by the kernel
    # and the reference alike.
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    w = torch.tensor([[1.0, -1.0, 0.0, 0.0], [2.0, -1.0, 0.5, -1.5], [1.0, 2.0, 0.0, 1.0]], dtype=torch.float64)
    xg, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, out_r = masked_mean(xg, w), ref.masked_mean(xr, w)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    (out_r * g).sum().backward()
    assert (out[:2] == 0).all() and (xg.grad[:2] == 0).all()
    torch.testing.assert_close(out, out_r)
    torch.testing.assert_close(xg.grad, xr.grad)
    torch.testing.assert_close(out[2], (x[2] * w[2, :, None]).sum(0) / 4)


@pytest.mark.proc
def test_direct_kernel_calls_reject_bad_input():
    # torch.ops.reasonrl_fast.* skip the Python wrapper: the kernels check every argument. In a
    # child process, so an out-of-bounds read fails this test only. Each line: type | outcome.
    lines = child_outcomes("""
        B, T, H = 3, 4, 5
        x, m, g = torch.randn(B, T, H), torch.ones(B, T, dtype=torch.bool), torch.randn(B, H)
        cases = [
            ("no exception", ops.masked_mean, x, m),
            ("no exception", ops.masked_mean_backward, g, m),
            ("ValueError", ops.masked_mean, torch.randn(B, T), m),
            ("ValueError", ops.masked_mean, torch.randn(B + 1, T, H), m),
            ("ValueError", ops.masked_mean, x, torch.ones(B, T + 1)),
            ("ValueError", ops.masked_mean, x, torch.ones(B - 1, T)),
            ("ValueError", ops.masked_mean, x, torch.ones(B * T)),
            ("ValueError", ops.masked_mean, x[:1, :1], torch.ones(20_000_000, 1, dtype=torch.bool)),
            ("TypeError", ops.masked_mean, x.long(), m),
            ("TypeError", ops.masked_mean, x.to(torch.float8_e4m3fn), m),
            ("TypeError", ops.masked_mean, x, m.to(torch.complex64)),
            ("ValueError", ops.masked_mean, x, m.to("meta")),
            ("ValueError", ops.masked_mean_backward, torch.randn(B), m),
            ("ValueError", ops.masked_mean_backward, torch.randn(B, H, 1), m),
            ("ValueError", ops.masked_mean_backward, torch.randn(B + 1, H), m),
            ("ValueError", ops.masked_mean_backward, g, torch.ones(B)),
            ("ValueError", ops.masked_mean_backward, g[:1], torch.ones(20_000_000, 1, dtype=torch.bool)),
            ("TypeError", ops.masked_mean_backward, g.long(), m),
            ("TypeError", ops.masked_mean_backward, g, m.to(torch.complex64)),
            ("ValueError", ops.masked_mean_backward, g, m.to("meta")),
        ]
        for want, fn, *args in cases:
            print(want + "|" + outcome(fn, *args))
    """)
    assert len(lines) == 20
    for line in lines:
        want, got = line.split("|", 1)
        assert got.split(":")[0] == want, line


def test_compile_rejects_bad_shapes_while_tracing():
    # The fake implementation checks shapes too (the op is called directly, without the
    # wrapper), so tracing fails with the kernel's message instead of building a graph around
    # an output whose shape means nothing.
    op = torch.ops.reasonrl_fast.masked_mean
    f = torch.compile(lambda a, m: op(a, m), fullgraph=True, backend="aot_eager")
    with pytest.raises(RuntimeError, match=r"ValueError.*mask must be \[B, T\]"):
        f(torch.randn(2, 3, 4), torch.ones(2, 4))


@pytest.mark.proc
@cuda_only
def test_direct_kernel_calls_reject_bad_input_cuda():
    # The CUDA kernels check sizes, dtypes and devices themselves: a mismatch raises the
    # promised Python exception, never an illegal memory access (hence the child process).
    lines = child_outcomes("""
        c = lambda *s, dt=torch.float32: torch.rand(s).to("cuda", dt)
        B, T = 3, 4
        big = torch.ones(20_000_000, 1, dtype=torch.bool, device="cuda")
        x, m, g = c(B, T, 8), c(B, T), c(B, 8)
        cases = [("no exception", lambda: ops.masked_mean(x, m)),
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
        for want, fn in cases:
            print(want + "|" + outcome(fn))
        torch.cuda.synchronize()
    """)
    check_typed_outcomes(lines, 11)


def test_without_last_token_drops_each_rows_last_prompt_position():
    """Left- and right-padded rows, a one-token prompt (kept: verl's mean over no position is
    0 / 0) and an empty row (stays empty)."""
    from reasonrl_fast.ops.zhead import without_last_token

    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 1, 1, 0]])
    assert without_last_token(mask).tolist() == [[0, 0, 1, 1, 0], [1, 1, 0, 0, 0], [0, 0, 0, 1, 0],
                                                 [0, 0, 0, 0, 0], [1, 0, 1, 0, 0]]
    assert without_last_token(mask.float()).dtype == torch.float32


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_zhead_published_pooling_is_verls_mean_over_the_prompt_but_its_last_token(seed):
    """float64, awkward sizes: log Z of `pooling="published"` is the MLP of the plain mean over
    each row's prompt positions but the last (verl's FlowRL actors), and differs from "all"."""
    g = torch.Generator().manual_seed(seed)
    B, T, H = 5, 11, 7
    h = torch.randn(B, T, H, dtype=torch.float64, generator=g, requires_grad=True)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    head = ZHead(H, num_layers=2, pooling="published").double().eval()
    ref_mask = mask.clone()
    ref_mask[torch.arange(B), lengths - 1] = 0
    ref = head.net((h * ref_mask[..., None]).sum(1) / ref_mask.sum(1, keepdim=True)).squeeze(-1)
    got = head(h, mask)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    (gh,) = torch.autograd.grad(got.sum(), h)
    (rh,) = torch.autograd.grad(ref.sum(), h)
    torch.testing.assert_close(gh, rh, rtol=1e-12, atol=1e-12)
    assert gh[torch.arange(B), lengths - 1].abs().max() == 0  # the last prompt token gets no gradient
    head.pooling = "all"
    assert (head(h, mask) - got).abs().max() > 1e-6
    with pytest.raises(ValueError, match="pooling='last'"):
        ZHead(H, pooling="last")
