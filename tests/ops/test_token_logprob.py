"""token_logprob against float64 references, on every device (DEVICES: CPU, and CUDA where
the extension has its CUDA kernels); the math is in docs/math.md §Token log-prob and entropy.

Awkward sizes on purpose: odd N and V (rows that are not 16-byte aligned, so the scalar head
and tail of vectorised loops run), a prime V, strided logits, ignored rows. Also: the direct
calls of the three schemas (every argument checked by the kernel), masked (-inf) vocabularies,
opcheck, gradcheck and torch.compile.
"""

import subprocess
import sys
import textwrap

import pytest
import torch

from reasonrl_fast.ops import reference as ref
from reasonrl_fast.ops import token_logprob
from tests.helpers.childproc import child_outcomes, run_snippet
from tests.helpers.ops import DEVICES, OPS, assert_no_recompile, cuda_only, gradcheck, max_err, opcheck

VOCABS = [1, 7, 1000, 1031]  # 1031: prime, not a multiple of any block


def _inputs(n, v, dtype=torch.float64, scale=3.0, ignore_frac=0.2):
    x = torch.randn(n, v, dtype=torch.float64) * scale
    t = torch.randint(0, v, (n,))
    t[torch.rand(n) < ignore_frac] = -100
    return x.to(dtype), t


def _ref_grads(x64, t, temperature, g_lp, g_ent):
    x = x64.clone().requires_grad_()
    lp, ent = ref.token_logprob(x, t, temperature)
    (lp * g_lp + ent * g_ent).sum().backward()
    return lp.detach(), ent.detach(), x.grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,V", [((7,), 1000), ((3, 5), 7), ((1,), 1), ((4, 9), 152064 // 64 + 3),
                                     ((0,), 11)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_forward_backward_awkward_sizes(device, shape, V, dtype, tau):
    """Outputs within float32 accumulation of the float64 truth; in low precision the gradient
    (stored in dtype) is within twice the error of the CPU kernel (on CUDA) or of plain
    PyTorch in dtype (on the CPU, whose own kernel it is)."""
    z64 = torch.randn(*shape, V, dtype=torch.float64) * 4
    y = torch.randint(0, V, shape)
    if y.numel() > 1:
        y.view(-1)[1] = -100
    z = z64.to(dtype)
    zc = z.to(device).requires_grad_()
    lp, ent = token_logprob(zc, y.to(device), temperature=tau, return_entropy=True)
    zr = z.double().requires_grad_()
    rlp, rent = ref.token_logprob(zr, y, tau)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(lp.cpu().double(), rlp, **tol)
    torch.testing.assert_close(ent.cpu().double(), rent, **tol)
    g1, g2 = torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64)
    (gz,) = torch.autograd.grad((lp.double() * g1.to(device)).sum() + (ent.double() * g2.to(device)).sum(), zc)
    (rz,) = torch.autograd.grad((rlp * g1).sum() + (rent * g2).sum(), zr)
    if dtype == torch.float64:
        torch.testing.assert_close(gz.cpu(), rz, rtol=1e-9, atol=1e-10)
        return
    if dtype == torch.float32 and device == "cpu":  # the float32 tolerance of the other tests
        torch.testing.assert_close(gz.double(), rz, rtol=2e-5, atol=2e-5)
        return
    twin = z.clone().requires_grad_()  # same rounding rules: the gradient is stored in dtype
    if device == "cpu":
        tlp, tent = ref.token_logprob(twin, y, tau)  # plain PyTorch in dtype
    else:
        tlp, tent = token_logprob(twin, y, temperature=tau, return_entropy=True)
    (tz,) = torch.autograd.grad((tlp.double() * g1).sum() + (tent.double() * g2).sum(), twin)
    assert max_err(gz, rz) <= 2 * max_err(tz, rz) + 1e-6, (max_err(gz, rz), max_err(tz, rz))


@pytest.mark.parametrize("v", VOCABS)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_matches_reference_float64(v, temperature):
    x, t = _inputs(37, v)
    g_lp, g_ent = torch.randn(37, dtype=torch.float64), torch.randn(37, dtype=torch.float64)
    lp_r, ent_r, grad_r = _ref_grads(x, t, temperature, g_lp, g_ent)
    xg = x.clone().requires_grad_()
    lp, ent = token_logprob(xg, t, temperature=temperature, return_entropy=True)
    (lp * g_lp + ent * g_ent).sum().backward()
    assert lp.dtype == torch.float64
    torch.testing.assert_close(lp, lp_r, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent, ent_r, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(xg.grad, grad_r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("v", VOCABS + [151936])
def test_float32_matches_reference(v):
    n = 3 if v > 10000 else 29
    x, t = _inputs(n, v)
    g_lp, g_ent = torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    lp_r, ent_r, grad_r = _ref_grads(x, t, 1.0, g_lp, g_ent)
    xg = x.float().requires_grad_()
    lp, ent = token_logprob(xg, t, return_entropy=True)
    (lp * g_lp.float() + ent * g_ent.float()).sum().backward()
    assert lp.dtype == torch.float32 and lp.shape == t.shape
    torch.testing.assert_close(lp.double(), lp_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), ent_r, rtol=1e-5, atol=1e-5)
    # The float32 tolerance of the other tests. The kernel saves lse = max + log(sum) as one
    # float32, so p = exp(s - lse) carries a relative error of up to ulp(lse) (about 1e-6 at
    # |lse| ~ 9 here); eager log_softmax keeps (s - max) - log(sum), exact near the max, and is
    # about 2.5x closer (measured over 4,000 draws). 1e-6 was below that floor: 0.2 % of draws
    # failed.
    torch.testing.assert_close(xg.grad.double(), grad_r, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_within_twice_plain_pytorch(dtype):
    x, t = _inputs(64, 1000, dtype=dtype, ignore_frac=0.0)
    x64 = x.double()  # the exact values the op sees
    g = torch.randn(64, dtype=torch.float64)
    lp_r, _, grad_r = _ref_grads(x64, t, 1.0, g, torch.zeros_like(g))

    xp = x.clone().requires_grad_()  # plain PyTorch at the same precision
    lp_p = torch.log_softmax(xp, -1).gather(-1, t[:, None]).squeeze(-1)
    (lp_p * g.to(dtype)).sum().backward()
    xo = x.clone().requires_grad_()
    lp_o = token_logprob(xo, t)
    (lp_o * g.float()).sum().backward()
    assert xo.grad.dtype == dtype
    for ours, plain, exact in ((lp_o, lp_p, lp_r), (xo.grad, xp.grad, grad_r)):
        err_o = (ours.double() - exact).abs().max().item()
        err_p = (plain.double() - exact).abs().max().item()
        assert err_o <= 2 * err_p, (err_o, err_p)


@pytest.mark.parametrize("device", DEVICES)
def test_leading_dims_and_strided_slice(device):
    x, _ = _inputs(4 * 9, 1000)
    x = x.view(4, 9, 1000).to(device)
    t = torch.randint(0, 1000, (4, 8), device=device)
    sliced = x[:, :-1, :]  # the usual "drop the last position" slice: not contiguous
    assert not sliced.is_contiguous()
    lp, ent = token_logprob(sliced, t, return_entropy=True)
    lp_r, ent_r = ref.token_logprob(sliced, t)
    assert lp.shape == (4, 8)
    torch.testing.assert_close(lp, lp_r)
    torch.testing.assert_close(ent, ent_r)
    xg = x.clone().requires_grad_()
    token_logprob(xg[:, :-1], t).sum().backward()
    xr = x.clone().requires_grad_()
    ref.token_logprob(xr[:, :-1], t)[0].sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_int32_targets_and_custom_ignore_index(device):
    x, t = (a.to(device) for a in _inputs(20, 50, ignore_frac=0.0))
    t[3] = 7
    lp = token_logprob(x, t.to(torch.int32).masked_fill(t == 7, 999), ignore_index=999)
    lp_r, _ = ref.token_logprob(x, t.masked_fill(t == 7, -100))
    torch.testing.assert_close(lp, lp_r)
    assert lp[3] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_ignored_rows_have_zero_output_and_gradient(device):
    x, t = (a.to(device) for a in _inputs(10, 33, ignore_frac=0.0))
    t[[2, 5]] = -100
    xg = x.clone().requires_grad_()
    lp, ent = token_logprob(xg, t, return_entropy=True)
    (lp + ent).sum().backward()
    assert (lp[[2, 5]] == 0).all() and (ent[[2, 5]] == 0).all()
    assert (xg.grad[[2, 5]] == 0).all() and (xg.grad[0] != 0).any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("return_entropy", [False, True])
def test_inplace_backward_matches_and_reuses_storage(device, return_entropy):
    x, t = (a.to(device) for a in _inputs(17, 1031, dtype=torch.float32))
    g = torch.randn(17, device=device)
    a = x.clone().requires_grad_()
    out = token_logprob(a, t, return_entropy=return_entropy)
    loss = (out[0] * g + out[1]).sum() if return_entropy else (out * g).sum()
    loss.backward()

    leaf = x.clone().requires_grad_()
    logits = leaf * 1.0  # a non-leaf, like an LM head's output
    ptr = logits.data_ptr()
    seen = {}
    logits.register_hook(lambda grad: seen.update(ptr=grad.data_ptr()))
    out = token_logprob(logits, t, return_entropy=return_entropy, inplace_backward=True)
    loss = (out[0] * g + out[1]).sum() if return_entropy else (out * g).sum()
    loss.backward()
    assert seen["ptr"] == ptr  # the gradient lives in the logits' storage
    torch.testing.assert_close(leaf.grad, a.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_masked_vocabulary_minus_inf(device):
    x, t = (a.to(device) for a in _inputs(6, 100, ignore_frac=0.0))
    x[:, 50:] = float("-inf")
    t = t % 50
    lp, ent = token_logprob(x, t, return_entropy=True)
    lp_r, ent_r = ref.token_logprob(x, t)
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    torch.testing.assert_close(lp, lp_r)
    torch.testing.assert_close(ent, ent_r)


def test_nan_row_stays_in_its_row():
    x, t = _inputs(5, 300, dtype=torch.float32, ignore_frac=0.0)
    x[2, 17] = float("nan")
    xg = x.clone().requires_grad_()
    lp, ent = token_logprob(xg, t, return_entropy=True)
    (lp + ent).sum().backward()
    assert torch.isnan(lp[2]) and torch.isnan(ent[2])
    keep = torch.tensor([0, 1, 3, 4])
    assert torch.isfinite(lp[keep]).all() and torch.isfinite(ent[keep]).all()
    assert torch.isnan(xg.grad[2]).any() and torch.isfinite(xg.grad[keep]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    x = torch.randn(0, 11, device=device, requires_grad=True)
    lp, ent = token_logprob(x, torch.zeros(0, dtype=torch.long, device=device), return_entropy=True)
    assert lp.shape == (0,) and ent.shape == (0,)
    lp.sum().backward()
    assert x.grad.shape == (0, 11)
    empty = token_logprob(torch.randn(2, 0, 5, device=device),
                          torch.zeros(2, 0, dtype=torch.long, device=device))
    assert empty.shape == (2, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device):
    x, t = (a.to(device) for a in _inputs(6, 13))
    t[1] = -100  # an ignored row
    gradcheck(lambda z: token_logprob(z, t, temperature=0.8, return_entropy=True), (x.requires_grad_(),))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("compute_entropy", [False, True])
def test_opcheck(device, dtype, compute_entropy):
    x, t = (a.to(device) for a in _inputs(9, 101, dtype=dtype))
    t[1] = -100
    x.requires_grad_()
    opcheck(OPS.token_logprob, (x, t, 0.9, -100, compute_entropy))
    lp, ent, lse = OPS.token_logprob(x.detach(), t, 0.9, -100, compute_entropy)
    g = torch.randn(9, device=device)
    g_ent = torch.randn(9, device=device) if compute_entropy else None
    opcheck(OPS.token_logprob_backward, (g, g_ent, x.detach(), t, lse, ent, 0.9, -100))
    opcheck(OPS.token_logprob_backward_, (g, g_ent, x.detach().clone(), t, lse, ent, 0.9, -100))


@pytest.mark.parametrize("device", DEVICES)
def test_strided_logits_and_inplace_backward_agree(device):
    """Leading dims sliced (rows start at odd element offsets) give the contiguous copy's
    numbers; the in-place backward gives exactly the out-of-place gradient."""
    base = torch.randn(3, 6, 101).to(torch.bfloat16)
    y = torch.randint(0, 101, (3, 5))
    z = base.to(device)[:, :-1]
    assert not z.is_contiguous()
    lp = token_logprob(z, y.to(device))
    torch.testing.assert_close(lp.cpu(), token_logprob(base[:, :-1].contiguous(), y), rtol=1e-5, atol=1e-5)
    a = base.to(device).contiguous()[:, :-1].clone().requires_grad_()
    b = a.detach().clone().requires_grad_()
    token_logprob(a, y.to(device)).sum().backward()
    token_logprob(b, y.to(device), inplace_backward=True).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def test_torch_compile_fullgraph():
    x, t = _inputs(12, 257, dtype=torch.float32)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(z, ids):
        lp, ent = token_logprob(z, ids, temperature=0.7, return_entropy=True)
        return (lp * 2 + ent).sum()

    a = x.clone().requires_grad_()
    f(a, t).backward()
    b = x.clone().requires_grad_()
    lp, ent = token_logprob(b, t, temperature=0.7, return_entropy=True)
    (lp * 2 + ent).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.heavy  # an inductor compile: C++ codegen on CPU
def test_torch_compile_inductor():
    x, t = _inputs(12, 257, dtype=torch.float32)
    f = torch.compile(lambda z, ids: token_logprob(z, ids).sum(), fullgraph=True)
    torch.testing.assert_close(f(x, t), token_logprob(x, t).sum())


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_dynamic_does_not_recompile(device):
    """One graph for every batch size: the fake implementation's shapes are symbolic in N."""

    def f(z, ids):
        lp, ent = token_logprob(z, ids, temperature=0.7, return_entropy=True)
        return lp * 2 + ent

    assert_no_recompile(f, lambda n: (torch.randn(n, 257, device=device),
                                      torch.randint(0, 257, (n,), device=device)))


class TestBadInput:
    def test_target_out_of_range(self):
        x = torch.randn(4, 10)
        with pytest.raises(IndexError, match="outside the vocabulary"):
            token_logprob(x, torch.tensor([1, 2, 10, 3]))
        with pytest.raises(IndexError, match="outside the vocabulary"):
            token_logprob(x, torch.tensor([1, 2, -5, 3]))

    def test_shape_mismatch(self):
        with pytest.raises(ValueError, match="shape"):
            token_logprob(torch.randn(4, 10), torch.zeros(5, dtype=torch.long))

    def test_non_floating_logits(self):
        with pytest.raises(TypeError, match="floating"):
            token_logprob(torch.ones(4, 10, dtype=torch.long), torch.zeros(4, dtype=torch.long))

    def test_float_targets(self):
        with pytest.raises(TypeError, match="integer"):
            token_logprob(torch.randn(4, 10), torch.zeros(4))

    @pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
    def test_bad_temperature(self, temperature):
        with pytest.raises(ValueError, match="temperature"):
            token_logprob(torch.randn(4, 10), torch.zeros(4, dtype=torch.long), temperature=temperature)

    def test_device_mismatch(self):
        with pytest.raises(ValueError, match="device"):
            token_logprob(torch.randn(4, 10), torch.zeros(4, dtype=torch.long, device="meta"))

    def test_empty_vocabulary(self):
        with pytest.raises(ValueError, match="vocabulary dimension is empty"):
            token_logprob(torch.randn(4, 0), torch.zeros(4, dtype=torch.long))

    def test_raw_op_validates_too(self):
        # The op itself checks (the Python wrapper is not the only line of defence).
        with pytest.raises(IndexError):
            torch.ops.reasonrl_fast.token_logprob(torch.randn(2, 5), torch.tensor([0, 9]), 1.0, -100, False)
        with pytest.raises(ValueError, match="temperature"):
            torch.ops.reasonrl_fast.token_logprob(torch.randn(2, 5), torch.tensor([0, 1]), 0.0, -100, False)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
    def test_temperature_too_small_for_the_accumulation_dtype(self, dtype):
        # 1/temperature must be finite in the accumulation dtype (float32, float64 for float64
        # logits); below that every output would be NaN.
        x, t = torch.randn(3, 10).to(dtype), torch.tensor([1, 2, 3])
        tiny = 1e-310 if dtype == torch.float64 else 1e-40
        with pytest.raises(ValueError, match="smallest"):
            token_logprob(x, t, temperature=tiny)
        smallest = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).tiny
        lp = token_logprob(torch.zeros(3, 10).to(dtype), t, temperature=smallest)
        torch.testing.assert_close(lp, torch.full((3,), -torch.tensor(10.0).log().item(), dtype=lp.dtype))

    def test_uint64_ids_above_int64_are_out_of_range(self):
        # A plain cast would wrap 2**64 - 100 to ignore_index (-100) and 2**63 + 5 to a negative id.
        x = torch.randn(2, 10)
        for big in (2**64 - 100, 2**63 + 5):
            with pytest.raises(IndexError, match="uint64"):
                token_logprob(x, torch.tensor([1, big], dtype=torch.uint64))
        torch.testing.assert_close(token_logprob(x, torch.tensor([1, 2], dtype=torch.uint64)),
                                   token_logprob(x, torch.tensor([1, 2])))

    def test_inplace_backward_refuses_logits_that_share_memory(self):
        leaf = torch.randn(10, requires_grad=True)
        t = torch.tensor([1, 2, 3, 4])
        with pytest.raises(ValueError, match="share memory"):
            token_logprob(leaf.expand(4, 10), t, inplace_backward=True)
        # The op refuses too, before writing anything.
        z = torch.randn(1, 10).expand(4, 10)
        lp, ent, lse = torch.ops.reasonrl_fast.token_logprob(z, t, 1.0, -100, False)
        with pytest.raises(ValueError, match="share memory"):
            torch.ops.reasonrl_fast.token_logprob_backward_(lp, None, z, t, lse, ent, 1.0, -100)
        # Strided but not overlapping (a slice) is fine.
        base = torch.randn(3, 6, 10)
        lp, ent, lse = torch.ops.reasonrl_fast.token_logprob(base[:, :-1], t[:3, None].expand(3, 5), 1.0, -100, False)
        torch.ops.reasonrl_fast.token_logprob_backward_(lp, None, base[:, :-1], t[:3, None].expand(3, 5), lse, ent, 1.0, -100)


# Masked vocabularies (-inf logits) in the backward: the gradient at a masked column is exactly
# 0 and every other entry is eager autograd's (log_softmax gather, entropy -sum p log p with
# 0 log 0 = 0), never the 0 * inf = NaN of a naive kernel.


def _masked_inputs(n, v, dtype, fill=float("-inf")):
    x, t = _inputs(n, v, ignore_frac=0.1)
    mask = torch.rand(n, v) < 0.3  # several masked columns in every row
    mask[0] = True  # row 0: everything masked but its target
    mask[1, :-1] = True  # row 1: all but the last column, which is its target
    t[0], t[1] = 5 % v, v - 1
    valid = t != -100
    mask[valid, t[valid]] = False  # targets stay unmasked (the masked-target case is separate)
    return x.masked_fill(mask, fill).to(dtype), t, mask


def _grads(fn, x, t, temperature, g_lp, g_ent):
    xg = x.clone().requires_grad_()
    lp, ent = fn(xg, t, temperature)
    (lp.double() * g_lp.to(x.device) + ent.double() * g_ent.to(x.device)).sum().backward()
    return lp.detach().double().cpu(), ent.detach().double().cpu(), xg.grad.double().cpu()


def _ours(x, t, temperature):
    return token_logprob(x, t, temperature=temperature, return_entropy=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_masked_columns_gradient(device, dtype, with_entropy, temperature):
    n, v = 11, 1031
    x, t, mask = _masked_inputs(n, v, dtype)
    g_lp = torch.randn(n, dtype=torch.float64)
    g_ent = torch.randn(n, dtype=torch.float64) if with_entropy else torch.zeros(n, dtype=torch.float64)
    lp, ent, grad = _grads(_ours, x.to(device), t.to(device), temperature, g_lp, g_ent)
    exact = _grads(ref.token_logprob, x.double(), t, temperature, g_lp, g_ent)  # the same values, in float64
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all() and torch.isfinite(grad).all()
    assert (grad[mask] == 0).all()
    if device != "cpu":
        if dtype == torch.float64:
            for ours, ex in zip((lp, ent, grad), exact):
                torch.testing.assert_close(ours, ex, rtol=1e-9, atol=1e-10)
            return
        for ours, ex in zip((lp, ent), exact):  # float32 accumulation, as the forward test
            torch.testing.assert_close(ours, ex, rtol=2e-5, atol=2e-5)
        # the gradient is stored in dtype: within twice the CPU kernel's error (same rounding)
        cpu_grad = _grads(_ours, x, t, temperature, g_lp, g_ent)[2]
        assert max_err(grad, exact[2]) <= 2 * max_err(cpu_grad, exact[2]) + 1e-6
        return
    if dtype in (torch.float64, torch.float32):
        tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
        for ours, ex in zip((lp, ent, grad), exact):
            torch.testing.assert_close(ours, ex, **tol)
        return
    plain = _grads(ref.token_logprob, x, t, temperature, g_lp.to(dtype), g_ent.to(dtype))  # eager, in dtype
    for ours, pl, ex in zip((lp, ent, grad), plain, exact):
        err_o, err_p = (ours - ex).abs().max().item(), (pl - ex).abs().max().item()
        assert err_o <= 2 * err_p + 1e-6, (err_o, err_p)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_masking_with_the_dtype_minimum(dtype, temperature):
    """finfo(dtype).min / 0.5 overflows to -inf in float32: the same as a -inf mask. At
    temperature 1 it stays finite, but its p is 0 and so must its gradient be."""
    n, v = 9, 257
    x, t, mask = _masked_inputs(n, v, dtype, fill=torch.finfo(dtype).min)
    g_lp, g_ent = torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    lp, ent, grad = _grads(_ours, x, t, temperature, g_lp, g_ent)
    assert torch.isfinite(grad).all() and (grad[mask] == 0).all()
    x_inf = x.masked_fill(mask, float("-inf"))
    for ours, ex in zip((lp, ent, grad), _grads(_ours, x_inf, t, temperature, g_lp, g_ent)):
        torch.testing.assert_close(ours, ex, rtol=0, atol=0)


def test_target_at_a_masked_column():
    """lp = -inf there (as log_softmax gives); the gradient is eager autograd's, which is finite:
    g_lp / T at the target, -p g_lp / T elsewhere, 0 at the other masked columns."""
    n, v = 6, 50
    x, t, mask = _masked_inputs(n, v, torch.float64)
    t[2] = int(mask[2].nonzero()[0])
    g_lp, g_ent = torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    lp, ent, grad = _grads(_ours, x, t, 0.8, g_lp, g_ent)
    lp_r, ent_r, grad_r = _grads(ref.token_logprob, x, t, 0.8, g_lp, g_ent)
    assert lp[2] == float("-inf") and torch.isfinite(ent).all()
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(grad, grad_r, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ent, ent_r, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad[2, t[2]], g_lp[2] / 0.8)
    for dtype in (torch.float32, torch.bfloat16):  # same in the float32 accumulation
        _, _, grad_d = _grads(_ours, x.to(dtype), t, 0.8, g_lp, g_ent)
        assert torch.isfinite(grad_d).all() and (grad_d[mask & (torch.arange(v) != t[:, None])] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_entropy", [False, True])
def test_masked_lm_head_gives_finite_weight_gradients(device, with_entropy):
    """logits = h @ W.T + mask: a NaN at one masked column would poison all of h.grad and W.grad."""
    n, hdim, v = 13, 16, 301
    h, w = torch.randn(n, hdim, device=device), torch.randn(v, hdim, device=device) / 4
    mask = torch.zeros(v).masked_fill(torch.rand(v) < 0.2, float("-inf"))
    t = torch.multinomial((mask == 0).float(), n, replacement=True).to(device)
    mask = mask.to(device)

    def run(fn):
        hg, wg = h.clone().requires_grad_(), w.clone().requires_grad_()
        lp, ent = fn(hg @ wg.T + mask, t, 0.9)
        (lp.sum() + (ent.sum() if with_entropy else 0)).backward()
        return hg.grad, wg.grad

    for ours, eager in zip(run(_ours), run(ref.token_logprob)):
        assert torch.isfinite(ours).all()
        torch.testing.assert_close(ours, eager, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64_masked(device):
    x, t, mask = (a.to(device) for a in _masked_inputs(5, 13, torch.float64))
    u = x.masked_fill(mask, 0.0).requires_grad_()  # the masked columns enter as a constant -inf
    neg = torch.zeros_like(x).masked_fill(mask, float("-inf"))
    gradcheck(lambda u: token_logprob(u + neg, t, temperature=0.8, return_entropy=True), (u,))


@pytest.mark.parametrize("device", DEVICES)
def test_inplace_backward_marks_the_logits_modified(device):
    """Another op saved the logits before the in-place backward overwrote them: autograd must
    raise its usual error instead of differentiating the overwritten values."""
    leaf = torch.randn(4, 10, device=device, requires_grad=True)
    t = torch.tensor([1, 2, 3, 4], device=device)
    z = leaf * 1.0
    cubed = z**3
    lp = token_logprob(z, t, inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (lp.sum() + cubed.sum()).backward()


@pytest.mark.parametrize("device", DEVICES)
def test_direct_inplace_backward_bumps_the_version_counter(device):
    """The mutating schema itself marks the overwrite, so a direct call is caught as well."""
    z = torch.randn(4, 10, device=device)
    t = torch.tensor([1, 2, -100, 4], device=device)
    _, ent, lse = OPS.token_logprob(z, t, 1.0, -100, False)
    before = z._version
    OPS.token_logprob_backward_(torch.ones(4, device=device), None, z, t, lse, ent, 1.0, -100)
    assert z._version > before


@pytest.mark.parametrize("device", DEVICES)
def test_inplace_refusals_and_tiny_temperature(device):
    leaf = torch.randn(10, device=device, requires_grad=True)
    y = torch.tensor([1, 2, 3, 4], device=device)
    with pytest.raises(ValueError, match="share memory"):
        token_logprob(leaf.expand(4, 10), y, inplace_backward=True)
    z = torch.randn(1, 10, device=device).expand(4, 10)
    lp, ent, lse = OPS.token_logprob(z, y, 1.0, -100, False)
    with pytest.raises(ValueError, match="share memory"):
        OPS.token_logprob_backward_(lp, None, z, y, lse, ent, 1.0, -100)
    with pytest.raises(ValueError, match="smallest"):
        token_logprob(torch.randn(4, 10, device=device), y, temperature=1e-40)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtype_minimum_columns_before_the_real_logits_keep_the_entropy_finite(device, dtype):
    # Masks filled with finfo.min ahead of a row's real logits: the running maximum starts at the
    # minimum and its terms are rescaled to 0 when a real logit arrives. Computed naively, that
    # rescale is 0 * -inf = NaN (it was, on CPU past one 1024-column block and on CUDA within one
    # warp's chunk).
    V = 5003
    lo = torch.finfo(dtype).min
    x = torch.full((3, V), lo, dtype=torch.float64)
    x[0, -1] = 1.0
    x[1, -3:] = torch.tensor([0.5, 1.0, 2.0])
    x[2] = torch.randn(V, dtype=torch.float64)
    x[2, :4000] = lo
    x = x.to(dtype)
    y = torch.tensor([V - 1, V - 2, V - 10])
    for tau in (1.0, 0.7):
        z = x.to(device).requires_grad_()
        lp, ent = token_logprob(z, y.to(device), temperature=tau, return_entropy=True)
        (lp.sum() + ent.sum()).backward()
        lsm = torch.log_softmax(x.double() / tau, -1)
        want_ent = -torch.where(lsm > float("-inf"), lsm.exp() * lsm, 0.0).sum(-1)
        torch.testing.assert_close(lp.double().cpu(), lsm.gather(1, y[:, None])[:, 0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ent.double().cpu(), want_ent, rtol=1e-4, atol=1e-4)
        assert torch.isfinite(z.grad).all()


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtype_minimum_mask_and_masked_target_match_the_cpu_kernel(dtype):
    x, y, mask = _masked_inputs(9, 257, dtype, fill=torch.finfo(dtype).min)
    y[2] = int(mask[2].nonzero()[0])  # a target at a masked column: lp = -inf, finite gradient
    for tau in (1.0, 0.5):  # at 0.5 the minimum overflows to -inf in float32
        zc = x.to("cuda").clone().requires_grad_()
        lp, ent = token_logprob(zc, y.to("cuda"), temperature=tau, return_entropy=True)
        (torch.where(torch.isfinite(lp), lp, 0).sum() + ent.sum()).backward()
        zr = x.clone().requires_grad_()
        lpr, entr = token_logprob(zr, y, temperature=tau, return_entropy=True)
        (torch.where(torch.isfinite(lpr), lpr, 0).sum() + entr.sum()).backward()
        assert torch.isfinite(zc.grad).all()
        other_masked = mask & (torch.arange(257) != y[:, None])
        assert (zc.grad.cpu()[other_masked] == 0).all()
        torch.testing.assert_close(zc.grad.cpu(), zr.grad, rtol=2e-2, atol=1e-5)


@cuda_only
def test_current_stream_is_used():
    s = torch.cuda.Stream()
    z = torch.randn(64, 5003, device="cuda")
    y = torch.randint(0, 5003, (64,), device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        lp = token_logprob(z, y)
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(lp.cpu(), token_logprob(z.cpu(), y.cpu()), rtol=1e-5, atol=1e-5)


# --- torch.ops.reasonrl_fast.token_logprob{,_backward,_backward_} called directly ---------------
# Every tensor argument is checked by the kernel itself: bad input raises the exception type
# the README promises and never reads or writes out of bounds. In a child interpreter, so a
# crash (the symptom of a missing check) fails the test instead of killing the session.

# Each case prints "<expected exception type>|<outcome>"; the snippet defines, for one schema,
# a call with every argument overridable by keyword.
# DEV is set by the caller; OTHER is a device the checks must refuse next to DEV (a meta tensor
# next to CPU ones dispatches to the fake implementation, which checks the same).
_SETUP = """
OTHER = "meta" if DEV == "cpu" else "cpu"
N, V = 5, 16
z = torch.randn(N, V, device=DEV)
t = torch.randint(0, V, (N,), device=DEV)
lp, ent, lse = ops.token_logprob(z, t, 1.0, -100, True)
g = torch.randn(N, device=DEV)

def fwd(z=z, t=t, T=1.0):
    return ops.token_logprob(z, t, T, -100, True)

def bwd(g=g, ge=g, z=z, t=t, lse=lse, ent=ent, T=1.0):
    return ops.token_logprob_backward(g, ge, z, t, lse, ent, T, -100)

def bwd_(g=g, ge=g, z=z, t=t, lse=lse, ent=ent, T=1.0):
    return ops.token_logprob_backward_(g, ge, z.clone(), t, lse, ent, T, -100)

def ids(v):
    out = t.clone()
    out[3] = v
    return out

big_uint = torch.tensor([1, 2, 3, 2**63 + 5, 0], dtype=torch.uint64, device=DEV)
"""

_CASES = _SETUP + """
cases = []
for name, fn in (("fwd", fwd), ("bwd", bwd), ("bwd_", bwd_)):
    common = [
        ("no exception", {}),
        # sizes
        ("ValueError", dict(t=t[:4])),
        ("ValueError", dict(z=z[:4])),
        ("ValueError", dict(z=z.view(N, 2, 8))),
        ("ValueError", dict(z=torch.tensor(1.0))),
        # dtypes
        ("TypeError", dict(z=z.long())),
        ("TypeError", dict(t=t.float())),
        ("TypeError", dict(t=t.bool())),
        # ids (on CUDA a device-side assertion: test_bad_id_fails_at_the_next_sync)
        *([("IndexError", dict(t=ids(10**12))),
           ("IndexError", dict(t=ids(V))),
           ("IndexError", dict(t=ids(40))),
           ("IndexError", dict(t=ids(-7))),
           ("IndexError", dict(t=big_uint))] if DEV == "cpu" else []),
        # temperature
        ("ValueError", dict(T=0.0)),
        ("ValueError", dict(T=-1.0)),
        ("ValueError", dict(T=float("nan"))),
        ("ValueError", dict(T=float("inf"))),
        ("ValueError", dict(T=1e-40)),
        # devices
        ("ValueError", dict(t=t.to(OTHER))),
    ]
    if name != "fwd":
        common += [
            ("ValueError", dict(g=g[:4])),
            ("ValueError", dict(ge=g[:4])),
            ("ValueError", dict(lse=lse[:1])),
            ("ValueError", dict(lse=lse[:4])),
            ("ValueError", dict(ent=ent[:4])),
            ("ValueError", dict(g=g.view(N, 1))),
            ("TypeError", dict(g=g.long())),
            ("TypeError", dict(ge=g.int())),
            ("TypeError", dict(lse=lse.double())),
            ("TypeError", dict(lse=lse.half())),
            ("TypeError", dict(ent=ent.double())),
            ("ValueError", dict(lse=lse.to(OTHER))),
            ("ValueError", dict(g=g.to(OTHER))),
            ("ValueError", dict(ge=g.to(OTHER))),
            ("ValueError", dict(ent=ent.to(OTHER))),
            # without an entropy gradient, entropy is not read: the forward's placeholder is fine
            ("no exception", dict(ge=None, ent=torch.empty(0, device=DEV))),
        ]
    for expected, kw in common:
        cases.append((name, expected, fn, kw))

for name, expected, fn, kw in cases:
    print(name, "|", expected, "|", sorted(kw), "|", outcome(fn, **kw))

# A bad id called in a loop: the old kernels wrote out of bounds and corrupted the heap.
for _ in range(200 if DEV == "cpu" else 0):
    for fn in (fwd, bwd, bwd_):
        assert outcome(fn, t=ids(40)).startswith("IndexError")
# A one-element lse for five million rows: the old kernels read far past its end.
zz = torch.zeros(5_000_000, 1, device=DEV)
tt = torch.zeros(5_000_000, dtype=torch.long, device=DEV)
print("bwd | ValueError | big | ", outcome(ops.token_logprob_backward, torch.zeros(5_000_000, device=DEV),
                                           None, zz, tt, torch.zeros(1, device=DEV),
                                           torch.empty(0, device=DEV), 1.0, -100))
"""


def check_cases(lines):
    """Each line is "schema | expected | arguments | outcome"."""
    assert len(lines) > 50, lines
    bad = [ln for ln in lines if not ln.split("|")[3].strip().startswith(ln.split("|")[1].strip())]
    assert not bad, "\n".join(bad)


@pytest.mark.proc
@pytest.mark.parametrize("device", DEVICES)
def test_direct_calls_raise_the_promised_errors(device):
    check_cases(child_outcomes(f"DEV = {device!r}\n" + _CASES, timeout=300))


@pytest.mark.proc
def test_fake_implementations_check_the_same():
    """Every tensor on meta: only the fake implementations run (what torch.compile traces)."""
    code = "DEV = 'meta'\n" + _SETUP + """
for name, fn in (("fwd", fwd), ("bwd", bwd), ("bwd_", bwd_)):
    print(name, "| no exception | ok |", outcome(fn))
    print(name, "| ValueError | t |", outcome(fn, t=t[:4]))
    print(name, "| TypeError | z |", outcome(fn, z=z.long()))
    print(name, "| TypeError | t |", outcome(fn, t=t.float()))
    print(name, "| ValueError | T |", outcome(fn, T=1e-40))
    if name != "fwd":
        print(name, "| ValueError | lse |", outcome(fn, lse=lse[:1]))
        print(name, "| ValueError | g |", outcome(fn, g=g[:4]))
        print(name, "| ValueError | ge |", outcome(fn, ge=g[:4]))
        print(name, "| ValueError | ent |", outcome(fn, ent=ent[:4]))
        print(name, "| TypeError | lse |", outcome(fn, lse=lse.double()))
"""
    lines = child_outcomes(code, timeout=120)
    assert len(lines) == 3 * 5 + 2 * 5, lines
    bad = [ln for ln in lines if not ln.split("|")[3].strip().startswith(ln.split("|")[1].strip())]
    assert not bad, "\n".join(bad)


@pytest.mark.proc
@cuda_only
def test_bad_target_is_reported():
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


@pytest.mark.proc
@cuda_only
@pytest.mark.parametrize("schema,bad", [("fwd", "ids(10**12)"), ("fwd", "ids(V)"), ("fwd", "ids(-7)"),
                                        ("fwd", "big_uint"), ("bwd", "ids(V)"), ("bwd", "big_uint"),
                                        ("bwd_", "ids(-7)"), ("bwd_", "ids(10**12)")])
def test_bad_id_fails_at_the_next_sync(schema, bad):
    """An out-of-range id (uint64 ids above the int64 range included) fails a device-side
    assertion, reported at the caller's next synchronisation; the call itself does not
    synchronise, and no result is ever returned as if valid. A device assertion poisons the CUDA
    context, so each case runs in its own child."""
    code = "DEV = 'cuda'\n" + _SETUP + f"""
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


@pytest.mark.parametrize("device", DEVICES)
def test_uint64_and_int32_ids_match_int64(device):
    """uint64 and int32 ids give exactly the int64 results; on CUDA without a synchronisation
    (the range check is a device-side assertion, never a copy to the host)."""
    z = torch.randn(6, 300, device=device)
    y = torch.randint(0, 300, (6,))
    y64, y32, g = y.to(torch.uint64).to(device), y.to(torch.int32).to(device), torch.randn(6, device=device)
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [OPS.token_logprob(z, ids, 1.0, -100, True) for ids in (y64, y32)]
        grads = [OPS.token_logprob_backward(g, g, z, ids, lse, ent, 1.0, -100)
                 for ids, (_, ent, lse) in zip((y64, y32), outs)]
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode(0)
    want = OPS.token_logprob(z, y.to(device), 1.0, -100, True)
    want_grad = OPS.token_logprob_backward(g, g, z, y.to(device), want[2], want[1], 1.0, -100)
    for out, grad in zip(outs, grads):
        for a, b in zip(out, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)
