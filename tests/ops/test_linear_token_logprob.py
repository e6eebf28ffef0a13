"""linear_token_logprob against float64 plain-PyTorch references, on each of its paths.

Paths (the `path` parameter):
- "cpu": CPU tensors, the chunked path (GEMMs and the CPU token_logprob kernels).
- "cuda": CUDA tensors, the compiled Triton kernels (where a GPU is present).
- "interpreter": CPU tensors routed to the Triton kernels (REASONRL_TRITON_CPU=1) in Triton's
  interpreter, on machines without a GPU. triton.jit picks the interpreter when a kernel is
  decorated, so TRITON_INTERPRET=1 must be set before triton is imported: these cases run in a
  fresh child interpreter (test_in_fresh_process) and skip in this process.
Also: the kernels compiled ahead of time for sm_80 and sm_90 without a GPU, and a dynamic
torch.compile that does not recompile across batch sizes.

Tiny awkward shapes keep the interpreter fast: odd N and H, V not a multiple of the 16-wide
interpreter tiles, several vocabulary splits in forward and several chunks in backward.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from reasonrl_fast.ops import linear_token_logprob
from reasonrl_fast.ops import reference as R
from tests.helpers.ops import ALL_FLOATS, HAS_CUDA, assert_no_recompile

# The package exports the function under the module's name; fetch the module itself.
L = importlib.import_module("reasonrl_fast.ops.linear_token_logprob")

HAS_TRITON = importlib.util.find_spec("triton") is not None
if HAS_TRITON:
    import triton

    # True when this process decorated triton's own helpers (and so the kernels) as
    # interpreted functions, i.e. TRITON_INTERPRET=1 was set before triton was imported.
    INTERPRETED = type(triton.language.standard._sum_combine).__name__ == "InterpretedFunction"
else:
    INTERPRETED = False
# The Triton kernels run compiled on a GPU, else interpreted on the CPU (not both: the
# interpreter adds nothing where the compiled kernels are tested).
TRITON_PATHS = (["cuda"] if HAS_CUDA else ["interpreter"]) if HAS_TRITON else []
PATHS = ["cpu"] + TRITON_PATHS


@pytest.fixture
def path(request, monkeypatch):
    """The path under test (indirect parameter): sets the environment that selects it."""
    p = request.param
    if p == "cpu":
        monkeypatch.delenv("REASONRL_TRITON_CPU", raising=False)
        return p
    if p == "interpreter" and not INTERPRETED:
        pytest.skip("the Triton interpreter needs TRITON_INTERPRET=1 before triton is imported: "
                    "these cases run in test_in_fresh_process")
    monkeypatch.setenv("REASONRL_TRITON_CPU", "1")
    monkeypatch.setenv("REASONRL_TRITON_SPLITS", "3")
    return p


def dev(path: str) -> str:
    return "cuda" if path == "cuda" else "cpu"


def by_path(cpu, triton, paths=None):
    """Cases for parametrize: each of `cpu` on the chunked path, each of `triton` on the Triton
    paths (tuples of further arguments, or single values)."""
    tup = lambda c: c if isinstance(c, tuple) else (c,)  # noqa: E731
    out = [("cpu", *tup(c)) for c in cpu]
    for p in paths if paths is not None else TRITON_PATHS:
        out += [(p, *tup(c)) for c in triton]
    return out

# (N, H, V, chunk): odd sizes, V not a multiple of any block, one-column vocabularies, chunks
# that do not divide V (None = the default chunk: a single chunk at these sizes).
SHAPES = [(7, 5, 1000, 64), (13, 33, 7, 3), (1, 3, 1, None), (5, 17, 131, None), (9, 4, 37, 1)]


def _inputs(N, H, V, dtype, bias, gen, ignore=True, lead=None):
    h = torch.randn(N, H, generator=gen, dtype=torch.float64).to(dtype)
    W = (torch.randn(V, H, generator=gen, dtype=torch.float64) / H**0.5 * 3).to(dtype)
    b = torch.randn(V, generator=gen, dtype=torch.float64).to(dtype) if bias else None
    y = torch.randint(0, V, (N,), generator=gen)
    if ignore and N > 1:
        y[1] = -100
    return h, W, b, y


def _ref(h, W, b, y, tau, ignore_index=-100):
    z = h @ W.T
    if b is not None:
        z = z + b
    return R.token_logprob(z, y, tau, ignore_index)


def check_matches_reference(device, N, H, V, chunk, monkeypatch, bias=True, tau=0.7, seed=0):
    if chunk is not None:
        monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", str(chunk))
    gen = torch.Generator().manual_seed(seed)
    h, W, b, y = _inputs(N, H, V, torch.float64, bias, gen)
    args = [t.to(device).requires_grad_() if t is not None and t.is_floating_point() else t
            for t in (h, W, b)]
    h_, W_, b_ = args
    lp, ent = linear_token_logprob(h_, W_, y.to(device), temperature=tau, bias=b_,
                                   return_entropy=True)
    ref_in = [t.detach().clone().requires_grad_() if t is not None else None for t in (h, W, b)]
    rlp, rent = _ref(*ref_in, y, tau)
    assert lp.dtype == torch.float64 and lp.shape == (N,)
    torch.testing.assert_close(lp.cpu(), rlp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent.cpu(), rent, rtol=1e-10, atol=1e-10)
    g1 = torch.randn(N, generator=gen, dtype=torch.float64)
    g2 = torch.randn(N, generator=gen, dtype=torch.float64)
    leaves = [t for t in (h_, W_, b_) if t is not None]
    got = torch.autograd.grad((lp * g1.to(device)).sum() + (ent * g2.to(device)).sum(), leaves)
    want = torch.autograd.grad((rlp * g1).sum() + (rent * g2).sum(),
                               [t for t in ref_in if t is not None])
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-9, atol=1e-10)
    if N > 1:  # the ignored row: zero outputs and no gradient to its hidden state
        assert lp[1].item() == 0 and ent[1].item() == 0
        assert got[0][1].abs().max().item() == 0


def check_low_precision(device, dtype, monkeypatch, N=17, H=40, V=301, chunk=64):
    """Error vs float64 at most twice plain PyTorch's at the same precision (+ a tiny floor)."""
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", str(chunk))
    gen = torch.Generator().manual_seed(1)
    h, W, b, y = _inputs(N, H, V, dtype, True, gen)
    # float64 truth on the same (rounded) inputs
    t_in = [t.double().requires_grad_() for t in (h, W, b)]
    tlp, tent = _ref(*t_in, y, 1.0)
    g1 = torch.randn(N, generator=gen, dtype=torch.float64)
    g2 = torch.randn(N, generator=gen, dtype=torch.float64)
    tg = torch.autograd.grad((tlp * g1 + tent * g2).sum(), t_in)
    # plain PyTorch in dtype
    p_in = [t.clone().requires_grad_() for t in (h, W, b)]
    plp, pent = _ref(*p_in, y, 1.0)
    pg = torch.autograd.grad((plp.double() * g1 + pent.double() * g2).sum(), p_in)
    # ours
    o_in = [t.to(device).requires_grad_() for t in (h, W, b)]
    olp, oent = linear_token_logprob(o_in[0], o_in[1], y.to(device), bias=o_in[2],
                                     return_entropy=True)
    assert olp.dtype == torch.float32
    og = torch.autograd.grad(
        (olp.double() * g1.to(device) + oent.double() * g2.to(device)).sum(), o_in)
    floor = 1e-6

    def err(a, b):
        return (a.double().cpu() - b).abs().max().item()

    for o, p, t in [(olp, plp, tlp), (oent, pent, tent)] + list(zip(og, pg, tg)):
        assert o.dtype in (torch.float32, dtype)
        assert err(o, t) <= 2 * err(p, t) + floor, (err(o, t), err(p, t))


class _MaxNumel(TorchDispatchMode):
    # On CUDA the Triton launches reach the mode as torch.library.wrap_triton's higher-order op
    # (they create no tensor); run them as they are.
    supports_higher_order_operators = True

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


def check_memory_bound(device, monkeypatch, N=257, H=4, V=4001, chunk=64, input_bytes=False):
    """No tensor the implementation creates is near [N, V]: the largest is the dW output.

    input_bytes: Triton's interpreter copies each input as a uint8 tensor (4 V H elements
    for a float32 weight); allow that, it is not part of the GPU path."""
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", str(chunk))
    gen = torch.Generator().manual_seed(2)
    h, W, b, y = (t.to(device) if t is not None else None
                  for t in _inputs(N, H, V, torch.float32, False, gen))
    with _MaxNumel() as fwd:
        lp, ent, lse = L._forward_impl(h, W, y, None, 1.0, -100, True)
    with _MaxNumel() as bwd:
        L._backward_impl(torch.ones_like(lp), torch.ones_like(ent), h, W, y, None, lse, ent,
                         1.0, -100)
    wh = V * H * (4 if input_bytes else 1)
    # O(N) statistics; the interpreter's byte copy of the [4, splits, N] partials is 64 N.
    on = N * (chunk + 1) + (64 * N if input_bytes else 0)
    assert fwd.max_numel <= max(on, wh if input_bytes else 0), fwd.max_numel
    assert bwd.max_numel <= max(wh, on), bwd.max_numel
    assert N * V > 5 * max(wh, on)  # the bound is a real constraint here


TRITON_SHAPES = [(7, 5, 100, 40), (13, 33, 37, 20), (1, 3, 1, None), (17, 19, 50, 17), (0, 5, 9, None)]


@pytest.mark.parametrize("path,N,H,V,chunk", by_path(SHAPES, TRITON_SHAPES), indirect=["path"])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_reference(path, N, H, V, chunk, bias, monkeypatch):
    device = dev(path)
    if N == 0:
        h = torch.randn(0, H, device=device, requires_grad=True)
        W = torch.randn(V, H, device=device, requires_grad=True)
        lp = linear_token_logprob(h, W, torch.zeros(0, dtype=torch.long, device=device))
        lp.sum().backward()
        assert lp.shape == (0,) and W.grad.abs().sum() == 0
        return
    check_matches_reference(device, N, H, V, chunk, monkeypatch, bias=bias)


@pytest.mark.parametrize("path,size", by_path([dict()], [dict(N=9, H=20, V=77, chunk=32)]), indirect=["path"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision(path, size, dtype, monkeypatch):
    check_low_precision(dev(path), dtype, monkeypatch, **size)


@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_memory_bound(path, monkeypatch):
    if path == "cpu":
        check_memory_bound("cpu", monkeypatch)
    else:
        check_memory_bound(dev(path), monkeypatch, N=97, H=2, V=600, chunk=16,
                           input_bytes=path == "interpreter")


@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_triton_path_is_used_where_expected(path):
    h = torch.randn(3, 4, device=dev(path))
    assert L._use_triton(h) == (path != "cpu")


@pytest.mark.parametrize("path", TRITON_PATHS, indirect=True)
@pytest.mark.parametrize("group", [0, 1, 3])
def test_every_launch_order_computes_every_tile_once(path, group, monkeypatch):
    # 7 row blocks of 16 and, in the backward's chunks of 48 columns, 3 tiles each: groups of 3
    # row blocks leave a last group of 1, and the forward's 3 splits take the column's place.
    monkeypatch.setenv("REASONRL_TRITON_GROUP_N", str(group))
    monkeypatch.setenv("REASONRL_TRITON_AUTOTUNE", "0")
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", "48")
    gen = torch.Generator().manual_seed(11)
    h, W, b, y = _inputs(100, 16, 130, torch.float64, True, gen)
    h, W, b = (t.to(dev(path)).requires_grad_() for t in (h, W, b))
    lp, ent = linear_token_logprob(h, W, y.to(dev(path)), bias=b, temperature=0.9, return_entropy=True)
    grads = torch.autograd.grad(lp.sum() + ent.sum(), (h, W, b))
    hr, Wr, br = (t.detach().cpu().requires_grad_() for t in (h, W, b))
    lpr, entr = _ref(hr, Wr, br, y, 0.9)
    want = torch.autograd.grad(lpr.sum() + entr.sum(), (hr, Wr, br))
    torch.testing.assert_close(lp.cpu(), lpr)
    torch.testing.assert_close(ent.cpu(), entr)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g.cpu(), w)


@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_masked_tile_columns_count_as_minus_infinity(path, monkeypatch):
    # V = 19: the last 16-wide tile has 13 masked columns. Logits of -50 everywhere: a masked
    # column read as 0 would dominate the log-sum-exp.
    monkeypatch.setenv("REASONRL_TRITON_SPLITS", "1")
    device = dev(path)
    h = torch.ones(3, 2, dtype=torch.float64, device=device)
    W = torch.full((19, 2), -25.0, dtype=torch.float64, device=device)
    lp, ent = linear_token_logprob(h, W, torch.tensor([0, 18, 7], device=device), return_entropy=True)
    want = -torch.log(torch.tensor(19.0, dtype=torch.float64))
    torch.testing.assert_close(lp.cpu(), want.expand(3))
    torch.testing.assert_close(ent.cpu(), (-want).expand(3))


@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_ignore_index_and_temperature(path, monkeypatch):
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", "16")
    device = dev(path)
    h = torch.randn(5, 6, dtype=torch.float64)
    W = torch.randn(21, 6, dtype=torch.float64)
    y = torch.tensor([3, 0, 20, 7, 7])
    lp, ent = linear_token_logprob(h.to(device), W.to(device), y.to(device), temperature=2.5,
                                   ignore_index=7, return_entropy=True)
    rlp, rent = _ref(h, W, None, y, 2.5, ignore_index=7)
    torch.testing.assert_close(lp.cpu(), rlp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent.cpu(), rent, rtol=1e-10, atol=1e-10)
    assert lp[3].item() == 0 and lp[4].item() == 0


@pytest.mark.parametrize("path", ["cpu"] + [p for p in TRITON_PATHS if p != "cuda"], indirect=True)
def test_bad_target_raises_index_error(path):
    # On CUDA a bad id is a device-side assertion instead: test_bad_target_direct_calls_cuda.
    h, W = torch.randn(3, 4), torch.randn(9, 4)
    with pytest.raises(IndexError, match="outside the vocabulary"):
        linear_token_logprob(h, W, torch.tensor([0, 9, 1]))


def test_matches_token_logprob_of_full_logits(monkeypatch):
    """Same numbers as the existing op on materialised logits (float32), leading dims too."""
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", "10")
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(2, 3, 6, generator=gen)
    W = torch.randn(29, 6, generator=gen)
    y = torch.randint(0, 29, (2, 3), generator=gen)
    from reasonrl_fast.ops import token_logprob

    lp, ent = linear_token_logprob(h, W, y, temperature=1.3, return_entropy=True)
    rlp, rent = token_logprob(h @ W.T, y, temperature=1.3, return_entropy=True)
    assert lp.shape == (2, 3)
    torch.testing.assert_close(lp, rlp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, rent, rtol=1e-5, atol=1e-5)


def test_empty_and_all_ignored():
    h = torch.randn(0, 4, requires_grad=True)
    W = torch.randn(9, 4, requires_grad=True)
    lp = linear_token_logprob(h, W, torch.zeros(0, dtype=torch.long))
    assert lp.shape == (0,)
    lp.sum().backward()
    assert W.grad.abs().sum() == 0 and h.grad.shape == (0, 4)
    h = torch.randn(3, 4, requires_grad=True)
    W.grad = None
    lp, ent = linear_token_logprob(h, W, torch.full((3,), 5), ignore_index=5, return_entropy=True)
    assert lp.abs().sum() == 0 and ent.abs().sum() == 0
    (lp.sum() + ent.sum()).backward()
    assert h.grad.abs().sum() == 0 and W.grad.abs().sum() == 0


def test_errors():
    h, W = torch.randn(3, 4), torch.randn(9, 4)
    with pytest.raises(IndexError, match="outside the vocabulary"):
        linear_token_logprob(h, W, torch.tensor([0, 9, 1]))
    with pytest.raises(IndexError):
        linear_token_logprob(h, W, torch.tensor([0, -1, 1]))
    with pytest.raises(ValueError, match="temperature"):
        linear_token_logprob(h, W, torch.tensor([0, 1, 2]), temperature=0.0)
    with pytest.raises(ValueError):
        linear_token_logprob(h, torch.randn(9, 5), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError):
        linear_token_logprob(h, W, torch.tensor([0, 1]))
    with pytest.raises(TypeError):
        linear_token_logprob(h, W.double(), torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError):
        linear_token_logprob(h, W, torch.tensor([0.0, 1.0, 2.0]))


def test_masked_columns_count_as_minus_infinity(monkeypatch):
    """A ragged last chunk must not add exp(0) terms: with very negative logits every column
    past V would dominate the sum if it were read as 0."""
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", "16")
    h = torch.ones(3, 2, dtype=torch.float64)
    W = torch.full((19, 2), -50.0, dtype=torch.float64)
    y = torch.tensor([0, 18, 7])
    lp = linear_token_logprob(h, W, y)
    torch.testing.assert_close(lp, torch.full((3,), -torch.log(torch.tensor(19.0)).item(),
                                              dtype=torch.float64))


def opcheck_args(device, dtype=torch.float64, bias=True, N=5, H=6, V=23):
    gen = torch.Generator().manual_seed(4)
    h, W, b, y = _inputs(N, H, V, dtype, bias, gen)
    mv = lambda t: t.to(device).requires_grad_() if t is not None else None  # noqa: E731
    return (mv(h), mv(W), y.to(device), mv(b), 0.9, -100, True)


@pytest.mark.parametrize("path,bias", by_path([True, False], [True]), indirect=["path"])
def test_opcheck(path, bias, monkeypatch):
    device = dev(path)
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", "5" if path == "cpu" else "16")
    # The Triton paths skip opcheck's dynamo test: it compiles the kernels (and the interpreter
    # cannot be compiled); test_torch_compile_* cover torch.compile.
    fwd_utils = (dict() if path == "cpu" else
                 dict(test_utils=("test_schema", "test_autograd_registration", "test_faketensor")))
    bwd_utils = dict() if path == "cpu" else dict(test_utils=("test_schema", "test_faketensor"))
    args = opcheck_args(device, bias=bias)
    torch.library.opcheck(L._linear_token_logprob, args, **fwd_utils)
    det = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    lp, ent, lse = L._linear_token_logprob(*det)
    h, W, y, b = det[:4]
    torch.library.opcheck(
        L._linear_token_logprob_backward,
        (torch.randn_like(lp), torch.randn_like(ent), h, W, y, b, lse, ent, 0.9, -100),
        **bwd_utils,
    )


@pytest.mark.parametrize("path,chunk,N,V", by_path([(4, 4, 9)], [(5, 3, 11)]), indirect=["path"])
def test_gradcheck(path, chunk, N, V, monkeypatch):
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", str(chunk))
    h, W, y, b, *_ = opcheck_args(dev(path), N=N, H=3, V=V)

    def f(h, W, b):
        return linear_token_logprob(h, W, y, temperature=0.8, bias=b, return_entropy=True)

    assert torch.autograd.gradcheck(f, (h, W, b))


def _compiled_vs_eager(backend, entropy):
    gen = torch.Generator().manual_seed(5)
    h = torch.randn(9, 8, generator=gen, requires_grad=True)
    W = torch.randn(50, 8, generator=gen, requires_grad=True)
    y = torch.randint(0, 50, (9,), generator=gen)

    def fn(h, W):
        out = linear_token_logprob(h, W, y, return_entropy=entropy)
        return out[0].sum() + out[1].sum() if entropy else out.sum()

    torch._dynamo.reset()
    f = torch.compile(fn, fullgraph=True, backend=backend)
    # No inductor/AOT caches: their key is the traced call of the op, not the op's Python
    # implementation, so a cache written by an older implementation would be replayed.
    with torch._inductor.config.patch(force_disable_caches=True):
        got = torch.autograd.grad(f(h, W), (h, W))
    want = torch.autograd.grad(fn(h, W), (h, W))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("entropy", [False, True])
def test_torch_compile_aot_eager(entropy, monkeypatch):
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", "16")
    _compiled_vs_eager("aot_eager", entropy)


@pytest.mark.heavy  # an inductor compile: C++ codegen on CPU
@pytest.mark.parametrize("entropy", [False, True])
def test_torch_compile_inductor_cpu(entropy, monkeypatch):
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", "16")
    _compiled_vs_eager("inductor", entropy)


@pytest.mark.skipif(not (HAS_CUDA and HAS_TRITON), reason="torch.compile of Triton kernels needs a GPU")
def test_torch_compile_sees_kernels():
    h = torch.randn(32, 64, device="cuda", requires_grad=True)
    W = torch.randn(1000, 64, device="cuda", requires_grad=True)
    y = torch.randint(0, 1000, (32,), device="cuda")
    f = torch.compile(lambda h, W: linear_token_logprob(h, W, y).sum(), fullgraph=True)
    out = f(h, W)
    out.backward()
    ref = linear_token_logprob(h.detach(), W.detach(), y).sum()
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("path", [p for p in PATHS if p != "interpreter"], indirect=True)
def test_torch_compile_dynamic_does_not_recompile(path, monkeypatch):
    """One graph for three batch sizes (a triton_op on CUDA, where inductor sees the kernels;
    the chunked implementation on CPU), gradients through the compiled graph included."""
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", "16")
    device = dev(path)
    W = torch.randn(50, 8, device=device)

    def f(h, y):
        lp, ent = linear_token_logprob(h, W, y, temperature=0.9, return_entropy=True)
        return lp + ent

    def args(n):
        return torch.randn(n, 8, device=device), torch.randint(0, 50, (n,), device=device)

    assert_no_recompile(f, args, backend="aot_eager" if path == "cpu" else "inductor")


# --- masked vocabulary columns (a -inf bias, or a bias so negative that logits / tau overflow) --

def _masked_inputs(dtype, kind, gen, N=7, H=5, V=40):
    """Columns 0-15 (a whole chunk or split at widths 1, 7 and 16), 20, 27 and the last one
    are masked. Row 0 targets a masked column, row 1 is ignored, the others target unmasked
    columns."""
    h, W, b, _ = _inputs(N, H, V, dtype, True, gen)
    mask = torch.zeros(V, dtype=torch.bool)
    mask[:16] = True
    mask[[20, 27, V - 1]] = True
    fill = float("-inf") if kind == "inf" else torch.finfo(dtype).min
    b = b.masked_fill(mask, fill)
    free = (~mask).nonzero().squeeze(1)
    y = free[torch.randint(0, free.numel(), (N,), generator=gen)]
    y[0], y[1] = 3, -100
    return h, W, b, y, mask


def _eager(h, W, b, y, tau, entropy, g1, g2):
    """(lp, ent, grads) of the eager formula log_softmax((h W^T + b) / tau), in h's dtype."""
    leaves = [t.clone().requires_grad_() for t in (h, W, b)]
    lp, ent = _ref(*leaves, y, tau)
    loss = (lp.double() * g1).sum() + ((ent.double() * g2).sum() if entropy else 0)
    return lp, ent, torch.autograd.grad(loss, leaves)


def _err(a, b):
    """Largest |a - b|, equal entries (the same infinity) counting 0; NaN in a gives NaN."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return torch.where(a == b, 0.0, (a - b).abs()).max().item()


def check_masked_columns(device, dtype, kind, entropy, chunks, monkeypatch, tau=0.7):
    """Masked columns get gradient exactly 0 and contribute nothing; a target on a masked column
    gets lp = -inf and the (finite) gradient of eager autograd; everything else matches
    the eager formula's autograd: in float64 closely, in lower precisions with at most twice
    the error of plain PyTorch at that precision (against float64)."""
    gen = torch.Generator().manual_seed(11)
    h, W, b, y, mask = _masked_inputs(dtype, kind, gen)
    N = h.shape[0]
    g1 = torch.randn(N, generator=gen, dtype=torch.float64)
    g2 = torch.randn(N, generator=gen, dtype=torch.float64)
    tlp, tent, tg = _eager(*(t.double() for t in (h, W, b)), y, tau, entropy, g1, g2)
    plp, pent, pg = _eager(h, W, b, y, tau, entropy, g1, g2)
    for chunk in chunks:
        if chunk is None:
            monkeypatch.delenv("REASONRL_LINEAR_LOGPROB_CHUNK", raising=False)
        else:
            monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", str(chunk))
        leaves = [t.to(device).requires_grad_() for t in (h, W, b)]
        out = linear_token_logprob(leaves[0], leaves[1], y.to(device), temperature=tau,
                                   bias=leaves[2], return_entropy=entropy)
        lp, ent = out if entropy else (out, None)
        loss = (lp.double() * g1.to(device)).sum()
        if entropy:
            loss = loss + (ent.double() * g2.to(device)).sum()
        got = torch.autograd.grad(loss, leaves)
        dh, dW, db = (g.cpu() for g in got)
        where = f"chunk {chunk}"
        # Masked columns no row targets get no gradient at all. Column 3 (row 0's target)
        # gets lp's finite gradient 1 - p = 1, as in eager autograd: compared below.
        quiet = mask.clone()
        quiet[3] = False
        assert db[quiet].eq(0).all() and dW[quiet].eq(0).all(), where
        assert lp[0].item() < -1e4 and lp[1].item() == 0, (where, lp[:2])
        pairs = [(lp, plp, tlp)] + ([(ent, pent, tent)] if entropy else []) + list(zip(got, pg, tg))
        for i, (o, p, t) in enumerate(pairs):
            if dtype == torch.float64:
                torch.testing.assert_close(o.detach().cpu(), t, rtol=1e-9, atol=1e-10,
                                           msg=lambda m: f"{where}, output {i}: {m}")
            elif dtype == torch.float32:
                # The float32 tolerance of the other float32 tests: the chunked dh sums the
                # chunks' GEMMs in float32, measured up to ~1e-6 relative (plain: ~1e-7).
                # Where float32 itself overflows (finfo.min / tau: lp = -inf), match plain float32.
                o, fin = o.detach().cpu().double(), p.detach().isfinite()
                assert o[~fin].equal(p.detach()[~fin].double()), (where, i)
                torch.testing.assert_close(o[fin], t[fin], rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"{where}, output {i}: {m}")
            else:
                assert _err(o, t) <= 2 * _err(p, t) + 1e-6, (where, i, _err(o, t), _err(p, t))


# Triton: three 16-wide splits in forward (the first fully masked) and chunks of 7 and 16 in
# backward (the first one or two fully masked).
@pytest.mark.parametrize("path,chunks", by_path([([1, 7, 16, None],)], [([7, 16],)]), indirect=["path"])
@pytest.mark.parametrize("dtype", ALL_FLOATS)
@pytest.mark.parametrize("kind", ["inf", "min"])
@pytest.mark.parametrize("entropy", [False, True])
def test_masked_bias_columns(path, chunks, dtype, kind, entropy, monkeypatch):
    check_masked_columns(dev(path), dtype, kind, entropy, chunks, monkeypatch)


def test_masked_chunk_forward_has_no_nan(monkeypatch):
    """A chunk whose logits are all -inf adds nothing to the log-sum-exp or the entropy (it used
    to merge its undefined 0/0 entropy as 0 * NaN)."""
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", "4")
    gen = torch.Generator().manual_seed(12)
    h, W, b, y, mask = _masked_inputs(torch.float64, "inf", gen)
    lp, ent = linear_token_logprob(h, W, y, temperature=0.7, bias=b, return_entropy=True)
    rlp, rent = _ref(h, W, b, y, 0.7)
    torch.testing.assert_close(lp, rlp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent, rent, rtol=1e-10, atol=1e-10)


# --- argument checks of the two ops, called directly -------------------------------------------

# Each case: (expression evaluated in the child, expected exception type or "no exception").
# Names in the child: fwd, bwd (the two ops), h, W, b, y (valid arguments: N = 3, H = 4, V = 5,
# float64), lp, ent, lse (a valid forward's outputs), g (a valid gradient), other (a device
# that is not dev), ii = -100.
_FWD = "fwd({h}, {W}, {y}, {b}, {t}, ii, True)"
_BWD = "bwd({g}, {ge}, {h}, {W}, {y}, {b}, {lse}, {ent}, {t}, ii)"
_ARGS = dict(h="h", W="W", y="y", b="b", t="0.9", g="g", ge="g", lse="lse", ent="ent")

_COMMON = [  # (argument, bad value, expected exception), for both ops
    ("h", "h[0]", "ValueError"), ("h", "h[None]", "ValueError"), ("h", "h[:, :3]", "ValueError"),
    ("h", "h[:2]", "ValueError"), ("h", "h.long()", "TypeError"), ("h", "h.float()", "TypeError"),
    ("h", "h.to(torch.complex128)", "TypeError"), ("h", "h.to(other)", "ValueError"),
    ("W", "W[0]", "ValueError"), ("W", "W[:, :3]", "ValueError"), ("W", "W.float()", "TypeError"),
    ("W", "W.to(other)", "ValueError"), ("W", "W[:0]", "ValueError"),
    ("y", "y[:2]", "ValueError"), ("y", "y[:, None]", "ValueError"),
    ("y", "y.double()", "TypeError"), ("y", "y.bool()", "TypeError"),
    ("y", "y.to(other)", "ValueError"),
    ("y", "torch.tensor([0, 5, 1], device=dev)", "IndexError"),
    ("y", "torch.tensor([0, -1, 1], device=dev)", "IndexError"),
    ("y", "torch.tensor([0, 2**64 - 100, 1], dtype=torch.uint64, device=dev)", "IndexError"),
    ("y", "torch.tensor([0, 2**63, 1], dtype=torch.uint64, device=dev)", "IndexError"),
    ("y", "torch.tensor([0, 4, 1], dtype=torch.uint64, device=dev)", "no exception"),
    ("y", "torch.tensor([0, 4, -100], dtype=torch.int32, device=dev)", "no exception"),
    ("b", "b[None]", "ValueError"), ("b", "b[:4]", "ValueError"), ("b", "b.float()", "TypeError"),
    ("b", "b.to(other)", "ValueError"), ("b", "None", "no exception"),
    ("t", "0.0", "ValueError"), ("t", "-1.0", "ValueError"), ("t", "float('nan')", "ValueError"),
    ("t", "float('inf')", "ValueError"), ("t", "1e-310", "ValueError"),
]
_BWD_ONLY = [
    ("g", "g[:2]", "ValueError"), ("g", "g[None]", "ValueError"), ("g", "g.long()", "TypeError"),
    ("g", "g.to(other)", "ValueError"),
    ("ge", "g[:2]", "ValueError"), ("ge", "g.long()", "TypeError"),
    ("ge", "g.to(other)", "ValueError"),
    ("ge", "None", "no exception"),
    ("lse", "lse[:2]", "ValueError"), ("lse", "lse.long()", "TypeError"),
    ("lse", "lse.to(other)", "ValueError"), ("lse", "lse[:0]", "ValueError"),
    ("ent", "ent[:2]", "ValueError"), ("ent", "ent.long()", "TypeError"),
    ("ent", "ent.to(other)", "ValueError"),
    ("ent", "ent[:0]", "ValueError"),  # an entropy gradient without the forward's entropy
]


def direct_call_cases():
    cases = [("fwd ok", _FWD.format(**_ARGS), "no exception"),
             ("bwd ok", _BWD.format(**_ARGS), "no exception")]
    for arg, bad, want in _COMMON:
        for name, fmt in (("fwd", _FWD), ("bwd", _BWD)):
            cases.append((f"{name} {arg}={bad}", fmt.format(**dict(_ARGS, **{arg: bad})), want))
    for arg, bad, want in _BWD_ONLY:
        cases.append((f"bwd {arg}={bad}", _BWD.format(**dict(_ARGS, **{arg: bad})), want))
    # 1/T overflows float32 (the accumulation dtype of float32, bfloat16 and float16 inputs)
    for dt in ("float", "bfloat16", "half"):
        lo = dict(h=f"h.{dt}()", W=f"W.{dt}()", b=f"b.{dt}()", t="1e-40")
        cases.append((f"fwd {dt} T=1e-40", _FWD.format(**dict(_ARGS, **lo)), "ValueError"))
        cases.append((f"bwd {dt} T=1e-40", _BWD.format(**dict(_ARGS, **lo)), "ValueError"))
    return cases


def check_direct_calls(device, env=None, skip_index_errors=False):
    """Every argument of both ops wrong in turn, in a child process (a crash fails the test
    with the signal's name instead of killing the session)."""
    from tests.helpers.childproc import child_outcomes

    cases = [c for c in direct_call_cases() if not (skip_index_errors and c[2] == "IndexError")]
    other = "meta" if device == "cpu" else "cpu"
    code = f"""
        import os
        dev, other, ii = {device!r}, {other!r}, -100
        fwd, bwd = ops.linear_token_logprob, ops.linear_token_logprob_backward
        gen = torch.Generator().manual_seed(0)
        h = torch.randn(3, 4, generator=gen, dtype=torch.float64).to(dev)
        W = torch.randn(5, 4, generator=gen, dtype=torch.float64).to(dev)
        b = torch.randn(5, generator=gen, dtype=torch.float64).to(dev)
        y = torch.tensor([0, 4, -100], device=dev)
        lp, ent, lse = fwd(h, W, y, b, 0.9, ii, True)
        g = torch.ones_like(lp)
        for expr in {[c[1] for c in cases]!r}:
            print(outcome(lambda: eval(expr)))
    """
    lines = child_outcomes(code, env=env, timeout=300)
    assert len(lines) == len(cases), lines
    wrong = [(name, want, line) for (name, _, want), line in zip(cases, lines)
             if not line.startswith(want)]
    assert not wrong, "\n".join(f"{n}: expected {w}, got {g}" for n, w, g in wrong)
    return dict(zip((c[0] for c in cases), lines))


@pytest.mark.proc
@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_direct_op_calls_validate_every_argument(path):
    if path == "cpu":
        got = check_direct_calls("cpu", env={"REASONRL_TRITON_CPU": "0"})
        assert "smallest supported temperature is 1.17549e-38" in got["fwd float T=1e-40"]
    elif path == "interpreter":
        check_direct_calls("cpu", env={"REASONRL_TRITON_CPU": "1", "TRITON_INTERPRET": "1"})
    else:
        # A bad target id fails a device-side assertion, which breaks the CUDA context of the
        # process: those cases run one per child in test_bad_target_direct_calls_cuda.
        check_direct_calls("cuda", skip_index_errors=True)


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1.5"])
def test_bad_chunk_variable(value, monkeypatch):
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", value)
    h = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(ValueError, match=f"REASONRL_LINEAR_LOGPROB_CHUNK.*{value}"):
        linear_token_logprob(h, torch.randn(9, 4), torch.tensor([0, 1, 2])).sum().backward()


def test_tiny_temperature_is_rejected():
    h, W, y = torch.randn(3, 4), torch.randn(9, 4), torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match="smallest supported temperature"):
        linear_token_logprob(h, W, y, temperature=1e-40)
    with pytest.raises(ValueError, match="smallest supported temperature"):
        linear_token_logprob(h.bfloat16(), W.bfloat16(), y, temperature=1e-40)
    # float64 accumulates in float64: 1e-40 is fine there
    lp = linear_token_logprob(h.double(), W.double(), y, temperature=1e-40)
    assert not lp.isnan().any()


_CUDA_ARGS = """
    fwd, bwd = ops.linear_token_logprob, ops.linear_token_logprob_backward
    dev = "cuda"
    h, W = torch.randn(3, 4, device=dev), torch.randn(5, 4, device=dev)
    ok = torch.tensor([0, 4, -100], device=dev)
    lp, ent, lse = fwd(h, W, ok, None, 0.9, -100, True)
    torch.cuda.synchronize()
"""


@pytest.mark.proc
@pytest.mark.skipif(not (HAS_CUDA and HAS_TRITON), reason="needs a GPU and triton")
@pytest.mark.parametrize("op", ["fwd", "bwd"])
@pytest.mark.parametrize("ids", ["torch.tensor([0, 5, 1], device=dev)",
                                 "torch.tensor([0, 2**64 - 100, 1], dtype=torch.uint64, "
                                 "device=dev)"])
def test_bad_target_direct_calls_cuda(op, ids):
    from tests.helpers.childproc import child_outcomes

    call = ("fwd(h, W, y, None, 0.9, -100, True)" if op == "fwd"
            else "bwd(torch.ones_like(lp), None, h, W, y, None, lse, ent, 0.9, -100)")
    code = _CUDA_ARGS + f"""
    y = {ids}
    print(outcome(lambda: ({call}, torch.cuda.synchronize())))
    """
    (line,) = child_outcomes(code)
    # a device-side assertion, raised at the synchronisation (AcceleratorError, a RuntimeError, in newer PyTorch)
    assert line.startswith(("RuntimeError", "AcceleratorError")) and "device-side assert" in line, line


def _grads_on(device, dtype=torch.float32):
    gen = torch.Generator().manual_seed(9)
    h, W, b, y = _inputs(37, 24, 300, dtype, True, gen)
    leaves = [t.to(device).requires_grad_() for t in (h, W, b)]
    lp, ent = linear_token_logprob(leaves[0], leaves[1], y.to(device), bias=leaves[2],
                                     temperature=0.8, return_entropy=True)
    grads = torch.autograd.grad(lp.sum() + ent.sum(), leaves)
    return [lp, ent, *grads]


@pytest.mark.skipif(not (HAS_CUDA and HAS_TRITON), reason="needs a GPU and triton")
def test_outputs_on_the_inputs_device_and_stream():
    dev = torch.device("cuda", torch.cuda.current_device())
    want = _grads_on(dev)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        got = _grads_on(dev)
    s.synchronize()
    for g, w in zip(got, want):
        assert g.device == dev
        torch.testing.assert_close(g, w)


@pytest.mark.proc
@pytest.mark.skipif(not HAS_TRITON or torch.cuda.device_count() < 2, reason="needs 2 GPUs and triton")
def test_second_gpu_while_the_first_is_current():
    """Tensors on cuda:1 while cuda:0 is current: the kernels must run on cuda:1 (a launch on
    cuda:0 with cuda:1 pointers faults or reads garbage). In a child: a fault may kill it."""
    from tests.helpers.childproc import child_outcomes

    code = """
    from tests.ops.test_linear_token_logprob import _grads_on
    torch.cuda.set_device(0)
    got = _grads_on(torch.device("cuda", 1))
    torch.cuda.synchronize(1)
    want = _grads_on(torch.device("cpu"), torch.float64)
    print(all(str(g.device) == "cuda:1" for g in got))
    for g, w in zip(got, want):
        print(outcome(torch.testing.assert_close, g.double().cpu(), w, rtol=1e-3, atol=1e-3))
    """
    lines = child_outcomes(code, env={"REASONRL_TRITON_CPU": "0"})
    assert lines[0] == "True", lines
    assert all(line == "no exception" for line in lines[1:]), lines


# --- ahead-of-time compilation of the Triton kernels for sm_80 and sm_90, without a GPU ---------
# The interpreter does not check what only the compiler checks (dtype rules of tl.dot, shared
# memory, register allocation); triton.compile with an explicit GPUTarget runs the full
# pipeline down to a cubin (ptxas ships in triton's wheel), so a kernel that would not compile
# on an A100/H100 fails here. Skipped when this triton cannot compile for CUDA offline, or when
# the kernels are interpreted in this process.


def _aot_kernels():
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    if INTERPRETED:
        pytest.skip("kernels are interpreted in this process")
    return importlib.import_module("reasonrl_fast.ops.triton.linear_logprob")


_T = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
      torch.float64: "fp64"}
_ACC = {torch.bfloat16: "fp32", torch.float16: "fp32", torch.float32: "fp32",
        torch.float64: "fp64"}


def _configs(tk, dtype, arch):
    """The autotuning candidates: all 16-bit ones for sm_90 (the H100/H200 case), else the
    first of each list (the one that must also fit an A100). Each compile takes seconds; a
    candidate that differs from an earlier one only in its launch order (GROUP_N) uses the same
    shared memory: it is compiled once, for the first grouped candidate (the grouped order's
    code), and run in the interpreter."""
    key = dtype if dtype in (torch.float32, torch.float64) else "16bit"
    configs = tk._CONFIGS[key]
    configs = configs if arch == 90 and key == "16bit" else configs[:1]
    seen, out, grouped = set(), [], False
    for c in configs:
        tile = (tuple(sorted((k, v) for k, v in c.kwargs.items() if k != "GROUP_N")), c.num_warps, c.num_stages)
        first_grouped = c.kwargs.get("GROUP_N", 0) != 0 and not grouped
        if tile not in seen or first_grouped:
            seen.add(tile)
            grouped |= c.kwargs.get("GROUP_N", 0) != 0
            out.append(c)
    return out


# Shared memory a block may use: A100 163 KiB, H100/H200 227 KiB.
_SHARED = {80: 163 * 1024, 90: 227 * 1024}


@pytest.mark.heavy  # Triton's full pipeline down to a cubin, seconds per kernel
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_kernels_compile_for_gpu(arch, dtype):
    tk = _aot_kernels()
    t, a = _T[dtype], _ACC[dtype]
    ACC, PREC = tk._types(dtype, torch.device("cuda"))
    for cfg in _configs(tk, dtype, arch):
        _compile_both(tk, arch, t, a, ACC, PREC, dict(cfg.kwargs),
                      dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))


def _compile_both(tk, arch, t, a, ACC, PREC, consts, opts):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts["UPCAST"] = False
    sig = {"h_ptr": f"*{t}", "w_ptr": f"*{t}", "b_ptr": f"*{t}", "y_ptr": "*i64",
           "m_ptr": f"*{a}", "s_ptr": f"*{a}", "e_ptr": f"*{a}", "t_ptr": f"*{a}",
           "N": "i32", "V": "i32", "H": "i32", "stride_hn": "i32", "stride_wv": "i32",
           "tau_ptr": f"*{a}", "N_BUCKET": "i32", "SPLITS": "i32",
           "HAS_BIAS": "constexpr", "ACC": "constexpr", "PREC": "constexpr",
           "UPCAST": "constexpr", "BLOCK_N": "constexpr", "BLOCK_V": "constexpr",
           "BLOCK_H": "constexpr", "GROUP_N": "constexpr"}
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
            "BLOCK_N": "constexpr", "BLOCK_V": "constexpr", "BLOCK_H": "constexpr",
            "GROUP_N": "constexpr"}
    const2 = dict(HAS_BIAS=True, HAS_ENT=True, ACC=ACC, PREC=PREC, **consts)
    src2 = ASTSource(tk._dz_kernel, sig2, constexprs=const2)
    k2 = triton.compile(src2, target=GPUTarget("cuda", arch, 32), options=opts)
    assert k2.asm.get("cubin")
    limit = _SHARED[arch]
    assert k.metadata.shared <= limit and k2.metadata.shared <= limit, (consts, opts)


@pytest.mark.proc
@pytest.mark.skipif("interpreter" not in TRITON_PATHS or INTERPRETED or bool(os.environ.get("_RRL_SUBPROCESS")),
                    reason="no interpreter cases, or they already run in this process")
def test_in_fresh_process():
    """The interpreter cases, in a child interpreter started with TRITON_INTERPRET=1."""
    env = dict(os.environ, TRITON_INTERPRET="1", _RRL_SUBPROCESS="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                        "-k", "interpreter and not test_in_fresh_process"],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]


# --- ignored rows are dropped before any logit is formed (eager) --------------------------------


def test_ignored_rows_form_no_logits(monkeypatch):
    lt = importlib.import_module("reasonrl_fast.ops.linear_token_logprob")
    rows = []
    fwd = lt._forward_chunks
    monkeypatch.setattr(lt, "_forward_chunks", lambda h, *a: (rows.append(h.shape[0]), fwd(h, *a))[1])
    gen = torch.Generator().manual_seed(4)
    h, W, b, y = _inputs(10, 6, 50, torch.float64, True, gen)
    y[[0, 1, 2, 3, 5, 7, 8]] = -100  # rows 4, 6 and 9 have a target
    h.requires_grad_()
    lp, ent = linear_token_logprob(h, W, y, bias=b, temperature=0.7, return_entropy=True)
    assert rows == [3]  # the logits of the 3 rows with a target, never of all 10
    want_lp, want_ent = _ref(h, W, b, y, 0.7)
    torch.testing.assert_close(lp, want_lp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent, want_ent, rtol=1e-10, atol=1e-10)
    (g,) = torch.autograd.grad(lp.sum() + ent.sum(), h)
    (g_ref,) = torch.autograd.grad(sum(t.sum() for t in _ref(h, W, b, y, 0.7)), h)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)
    assert (g[y == -100] == 0).all()


def test_all_rows_ignored():
    h = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    W = torch.randn(9, 6, dtype=torch.float64, requires_grad=True)
    y = torch.full((4,), -100)
    lp, ent = linear_token_logprob(h, W, y, return_entropy=True)
    assert (lp == 0).all() and (ent == 0).all()
    gh, gW = torch.autograd.grad(lp.sum() + ent.sum(), (h, W))
    assert (gh == 0).all() and (gW == 0).all()


@pytest.mark.skipif(not (HAS_CUDA and HAS_TRITON), reason="needs a GPU and triton")
def test_autotuned_tiles_match_the_first_candidate(monkeypatch):
    """The autotuned launch (every candidate timed on the card) and the first candidate alone
    (REASONRL_TRITON_AUTOTUNE=0, what the other tests use) give the same numbers."""
    gen = torch.Generator().manual_seed(5)
    h, W, b, y = _inputs(300, 64, 1000, torch.bfloat16, False, gen)
    h, W, y = h.cuda(), W.cuda(), y.cuda()
    outs = {}
    for mode in ("1", "0"):
        monkeypatch.setenv("REASONRL_TRITON_AUTOTUNE", mode)
        hh, WW = h.clone().requires_grad_(), W.clone().requires_grad_()
        lp, ent = linear_token_logprob(hh, WW, y, return_entropy=True)
        outs[mode] = [lp, ent, *torch.autograd.grad(lp.sum() + ent.sum(), (hh, WW))]
    for a, b_ in zip(outs["1"], outs["0"]):
        torch.testing.assert_close(a.float(), b_.float(), rtol=2e-2, atol=2e-2)


def test_a_rounded_addmm_fallback_warns_once_and_out_of_memory_is_not_swallowed(monkeypatch):
    # The backward's dh += dz @ W wants a float32 product of 16-bit operands (aten::addmm with
    # out_dtype); a torch without that overload gets the rounded product, and says so once.
    import warnings

    monkeypatch.setattr(L, "_ROUNDED_ADDMM_WARNED", False)

    def missing(*args, **kwargs):
        raise RuntimeError("addmm: out_dtype is not supported here")

    monkeypatch.setattr(torch, "addmm", missing)
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(3, 4, generator=gen).to(torch.bfloat16)
    b = torch.randn(4, 5, generator=gen).to(torch.bfloat16)
    acc = torch.zeros(3, 5)
    with pytest.warns(RuntimeWarning, match="no float32-output addmm for torch.bfloat16"):
        L._addmm_f32(acc, a, b)
    torch.testing.assert_close(acc, (a @ b).float())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second fallback is silent
        L._addmm_f32(acc, a, b)

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(torch, "addmm", oom)
    with pytest.raises(torch.OutOfMemoryError):
        L._addmm_f32(acc, a, b)
