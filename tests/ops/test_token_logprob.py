"""token_logprob against the float64 reference (docs/math.md §Token log-prob and entropy)."""

import pytest
import torch

from reasonrl_fast.ops import reference as ref
from reasonrl_fast.ops import token_logprob

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
    torch.testing.assert_close(xg.grad.double(), grad_r, rtol=1e-5, atol=1e-6)


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


def test_leading_dims_and_strided_slice():
    x, _ = _inputs(4 * 9, 1000)
    x = x.view(4, 9, 1000)
    t = torch.randint(0, 1000, (4, 8))
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


def test_int32_targets_and_custom_ignore_index():
    x, t = _inputs(20, 50, ignore_frac=0.0)
    t[3] = 7
    lp = token_logprob(x, t.to(torch.int32).masked_fill(t == 7, 999), ignore_index=999)
    lp_r, _ = ref.token_logprob(x, t.masked_fill(t == 7, -100))
    torch.testing.assert_close(lp, lp_r)
    assert lp[3] == 0


def test_ignored_rows_have_zero_output_and_gradient():
    x, t = _inputs(10, 33, ignore_frac=0.0)
    t[[2, 5]] = -100
    xg = x.clone().requires_grad_()
    lp, ent = token_logprob(xg, t, return_entropy=True)
    (lp + ent).sum().backward()
    assert (lp[[2, 5]] == 0).all() and (ent[[2, 5]] == 0).all()
    assert (xg.grad[[2, 5]] == 0).all() and (xg.grad[0] != 0).any()


@pytest.mark.parametrize("return_entropy", [False, True])
def test_inplace_backward_matches_and_reuses_storage(return_entropy):
    x, t = _inputs(17, 1031, dtype=torch.float32)
    g = torch.randn(17)
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


def test_masked_vocabulary_minus_inf():
    x, t = _inputs(6, 100, ignore_frac=0.0)
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


def test_empty_batch():
    x = torch.randn(0, 11, requires_grad=True)
    lp, ent = token_logprob(x, torch.zeros(0, dtype=torch.long), return_entropy=True)
    assert lp.shape == (0,) and ent.shape == (0,)
    lp.sum().backward()
    assert x.grad.shape == (0, 11)
    assert token_logprob(torch.randn(2, 0, 5), torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0)


def test_gradcheck_float64():
    x, t = _inputs(6, 13)
    x.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda z: token_logprob(z, t, temperature=0.8, return_entropy=True), (x,)
    )


@pytest.mark.parametrize("compute_entropy", [False, True])
def test_opcheck(compute_entropy):
    x, t = _inputs(9, 101, dtype=torch.float32)
    x.requires_grad_()
    op = torch.ops.reasonrl_fast
    torch.library.opcheck(op.token_logprob, (x, t, 0.9, -100, compute_entropy))
    lp, ent, lse = op.token_logprob(x.detach(), t, 0.9, -100, compute_entropy)
    g = torch.randn(9)
    g_ent = torch.randn(9) if compute_entropy else None
    torch.library.opcheck(op.token_logprob_backward, (g, g_ent, x.detach(), t, lse, ent, 0.9, -100))
    torch.library.opcheck(
        op.token_logprob_backward_, (g, g_ent, x.detach().clone(), t, lse, ent, 0.9, -100)
    )


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


def test_torch_compile_inductor():
    x, t = _inputs(12, 257, dtype=torch.float32)
    f = torch.compile(lambda z, ids: token_logprob(z, ids).sum(), fullgraph=True)
    torch.testing.assert_close(f(x, t), token_logprob(x, t).sum())


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
    (lp.double() * g_lp + ent.double() * g_ent).sum().backward()
    return lp.detach().double(), ent.detach().double(), xg.grad.double()


def _ours(x, t, temperature):
    return token_logprob(x, t, temperature=temperature, return_entropy=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_masked_columns_gradient(dtype, with_entropy, temperature):
    n, v = 11, 1031
    x, t, mask = _masked_inputs(n, v, dtype)
    g_lp = torch.randn(n, dtype=torch.float64)
    g_ent = torch.randn(n, dtype=torch.float64) if with_entropy else torch.zeros(n, dtype=torch.float64)
    lp, ent, grad = _grads(_ours, x, t, temperature, g_lp, g_ent)
    exact = _grads(ref.token_logprob, x.double(), t, temperature, g_lp, g_ent)  # the same values, in float64
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all() and torch.isfinite(grad).all()
    assert (grad[mask] == 0).all()
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


@pytest.mark.parametrize("with_entropy", [False, True])
def test_masked_lm_head_gives_finite_weight_gradients(with_entropy):
    """logits = h @ W.T + mask: a NaN at one masked column would poison all of h.grad and W.grad."""
    n, hdim, v = 13, 16, 301
    h, w = torch.randn(n, hdim), torch.randn(v, hdim) / 4
    mask = torch.zeros(v).masked_fill(torch.rand(v) < 0.2, float("-inf"))
    t = torch.multinomial((mask == 0).float(), n, replacement=True)

    def run(fn):
        hg, wg = h.clone().requires_grad_(), w.clone().requires_grad_()
        lp, ent = fn(hg @ wg.T + mask, t, 0.9)
        (lp.sum() + (ent.sum() if with_entropy else 0)).backward()
        return hg.grad, wg.grad

    for ours, eager in zip(run(_ours), run(ref.token_logprob)):
        assert torch.isfinite(ours).all()
        torch.testing.assert_close(ours, eager, rtol=1e-4, atol=1e-5)


def test_gradcheck_float64_masked():
    x, t, mask = _masked_inputs(5, 13, torch.float64)
    u = x.masked_fill(mask, 0.0).requires_grad_()  # the masked columns enter as a constant -inf
    neg = torch.zeros_like(x).masked_fill(mask, float("-inf"))
    assert torch.autograd.gradcheck(
        lambda u: token_logprob(u + neg, t, temperature=0.8, return_entropy=True), (u,)
    )


def test_inplace_backward_marks_the_logits_modified():
    """Another op saved the logits before the in-place backward overwrote them: autograd must
    raise its usual error instead of differentiating the overwritten values."""
    leaf = torch.randn(4, 10, requires_grad=True)
    t = torch.tensor([1, 2, 3, 4])
    z = leaf * 1.0
    cubed = z**3
    lp = token_logprob(z, t, inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (lp.sum() + cubed.sum()).backward()


def test_direct_inplace_backward_bumps_the_version_counter():
    """The mutating schema itself marks the overwrite, so a direct call is caught as well."""
    z = torch.randn(4, 10)
    t = torch.tensor([1, 2, -100, 4])
    _, ent, lse = torch.ops.reasonrl_fast.token_logprob(z, t, 1.0, -100, False)
    before = z._version
    torch.ops.reasonrl_fast.token_logprob_backward_(torch.ones(4), None, z, t, lse, ent, 1.0, -100)
    assert z._version > before
