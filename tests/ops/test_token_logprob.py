"""token_logprob against the float64 reference (SPEC.md §1)."""

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
        with pytest.raises(RuntimeError, match="vocabulary dimension is empty"):
            token_logprob(torch.randn(4, 0), torch.zeros(4, dtype=torch.long))

    def test_raw_op_validates_too(self):
        # The op itself checks (the Python wrapper is not the only line of defence).
        with pytest.raises(IndexError):
            torch.ops.reasonrl_fast.token_logprob(torch.randn(2, 5), torch.tensor([0, 9]), 1.0, -100, False)
        with pytest.raises(RuntimeError, match="temperature"):
            torch.ops.reasonrl_fast.token_logprob(torch.randn(2, 5), torch.tensor([0, 1]), 0.0, -100, False)
