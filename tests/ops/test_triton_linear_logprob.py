"""The Triton kernels of linear_token_logprob, against the float64 references.

Without a GPU they run on CPU tensors in Triton's interpreter: this module sets
TRITON_INTERPRET=1 and reloads the kernel module (triton.jit reads the flag when a kernel is
decorated), and REASONRL_TRITON_CPU=1 routes CPU tensors to the Triton path. With a GPU the
same checks run on CUDA tensors with compiled kernels. Tiny awkward shapes keep the
interpreter fast: odd N and H, V not a multiple of the 16-wide interpreter tiles, several
vocabulary splits in forward and several chunks in backward.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
_FRESH = "triton" not in sys.modules
if DEVICE == "cpu" and _FRESH:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: see below

import pytest  # noqa: E402

triton = pytest.importorskip("triton")
# triton.jit picks the interpreter when a function is decorated, triton's own helpers
# (tl.sum's combine functions, ...) included. If another test module imported triton first
# without the flag, the kernels cannot be interpreted in this process: the whole module then
# runs once more in a fresh interpreter (test_in_fresh_process) and its tests skip here.
_INTERPRETED = type(triton.language.standard._sum_combine).__name__ == "InterpretedFunction"
_RUN_HERE = DEVICE == "cuda" or _INTERPRETED

from tests.ops import test_linear_token_logprob as T  # noqa: E402  (shared checks)

L = T.L


@pytest.fixture(autouse=True)
def _triton_path(monkeypatch, request):
    if not _RUN_HERE and request.node.name != "test_in_fresh_process":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set: these tests run "
                    "in test_in_fresh_process")
    monkeypatch.setenv("REASONRL_TRITON_CPU", "1")
    monkeypatch.setenv("REASONRL_TRITON_SPLITS", "3")


def test_triton_path_is_used():
    h = torch.randn(3, 4, device=DEVICE)
    assert L._use_triton(h)


SHAPES = [(7, 5, 100, 40), (13, 33, 37, 20), (1, 3, 1, None), (17, 19, 50, 17), (0, 5, 9, None)]


@pytest.mark.parametrize("N,H,V,chunk", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_matches_reference(N, H, V, chunk, bias, monkeypatch):
    if N == 0:
        h = torch.randn(0, H, device=DEVICE, requires_grad=True)
        W = torch.randn(V, H, device=DEVICE, requires_grad=True)
        lp = T.linear_token_logprob(h, W, torch.zeros(0, dtype=torch.long, device=DEVICE))
        lp.sum().backward()
        assert lp.shape == (0,) and W.grad.abs().sum() == 0
        return
    T.check_matches_reference(DEVICE, N, H, V, chunk, monkeypatch, bias=bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision(dtype, monkeypatch):
    T.check_low_precision(DEVICE, dtype, monkeypatch, N=9, H=20, V=77, chunk=32)


def test_memory_bound(monkeypatch):
    T.check_memory_bound(DEVICE, monkeypatch, N=97, H=2, V=600, chunk=16,
                         input_bytes=DEVICE == "cpu")


def test_masked_columns_count_as_minus_infinity(monkeypatch):
    # V = 19: the last 16-wide tile has 13 masked columns. Logits of -50 everywhere: a masked
    # column read as 0 would dominate the log-sum-exp.
    monkeypatch.setenv("REASONRL_TRITON_SPLITS", "1")
    h = torch.ones(3, 2, dtype=torch.float64, device=DEVICE)
    W = torch.full((19, 2), -25.0, dtype=torch.float64, device=DEVICE)
    lp, ent = T.linear_token_logprob(h, W, torch.tensor([0, 18, 7], device=DEVICE),
                                     return_entropy=True)
    want = -torch.log(torch.tensor(19.0, dtype=torch.float64))
    torch.testing.assert_close(lp.cpu(), want.expand(3))
    torch.testing.assert_close(ent.cpu(), (-want).expand(3))


def test_ignore_index_and_temperature(monkeypatch):
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", "16")
    gen = torch.Generator().manual_seed(7)
    h = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    W = torch.randn(21, 6, generator=gen, dtype=torch.float64)
    y = torch.tensor([3, 0, 20, 7, 7])
    lp, ent = T.linear_token_logprob(h.to(DEVICE), W.to(DEVICE), y.to(DEVICE), temperature=2.5,
                                     ignore_index=7, return_entropy=True)
    rlp, rent = T._ref(h, W, None, y, 2.5, ignore_index=7)
    torch.testing.assert_close(lp.cpu(), rlp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent.cpu(), rent, rtol=1e-10, atol=1e-10)
    assert lp[3].item() == 0 and lp[4].item() == 0


def test_bad_target():
    h, W = torch.randn(3, 4, device=DEVICE), torch.randn(9, 4, device=DEVICE)
    if DEVICE == "cpu":
        with pytest.raises(IndexError, match="outside the vocabulary"):
            T.linear_token_logprob(h, W, torch.tensor([0, 9, 1]))


def test_opcheck(monkeypatch):
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", "16")
    args = T.opcheck_args(DEVICE, N=5, H=6, V=23)
    torch.library.opcheck(L._linear_token_logprob, args,
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))
    det = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    lp, ent, lse = L._linear_token_logprob(*det)
    torch.library.opcheck(
        L._linear_token_logprob_backward,
        (torch.randn_like(lp), torch.randn_like(ent), det[0], det[1], det[2], det[3], lse, ent,
         0.9, -100),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_gradcheck(monkeypatch):
    monkeypatch.setenv("REASONRL_LINEAR_LOGPROB_CHUNK", "5")
    h, W, y, b, *_ = T.opcheck_args(DEVICE, N=3, H=3, V=11)

    def f(h, W, b):
        return T.linear_token_logprob(h, W, y, temperature=0.8, bias=b, return_entropy=True)

    assert torch.autograd.gradcheck(f, (h, W, b))


@pytest.mark.skipif(DEVICE == "cpu", reason="torch.compile of Triton kernels needs a GPU")
def test_torch_compile_sees_kernels():
    h = torch.randn(32, 64, device=DEVICE, requires_grad=True)
    W = torch.randn(1000, 64, device=DEVICE, requires_grad=True)
    y = torch.randint(0, 1000, (32,), device=DEVICE)
    f = torch.compile(lambda h, W: T.linear_token_logprob(h, W, y).sum(), fullgraph=True)
    out = f(h, W)
    out.backward()
    ref = T.linear_token_logprob(h.detach(), W.detach(), y).sum()
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("dtype", T.ALL_FLOATS)
@pytest.mark.parametrize("kind", ["inf", "min"])
@pytest.mark.parametrize("entropy", [False, True])
def test_masked_bias_columns(dtype, kind, entropy, monkeypatch):
    # Three 16-wide splits in forward (the first fully masked) and chunks of 7 and 16 in
    # backward (the first one or two fully masked).
    T.check_masked_columns(DEVICE, dtype, kind, entropy, [7, 16], monkeypatch)


def test_direct_op_calls_validate_every_argument():
    # On CUDA a bad target id fails a device-side assertion, which breaks the CUDA context of
    # the process: those cases run one per child in test_bad_target_direct_calls_cuda.
    env = {"REASONRL_TRITON_CPU": "1", "TRITON_INTERPRET": "1"} if DEVICE == "cpu" else None
    T.check_direct_calls(DEVICE, env=env, skip_index_errors=DEVICE == "cuda")


_CUDA_ARGS = """
    fwd, bwd = ops.linear_token_logprob, ops.linear_token_logprob_backward
    dev = "cuda"
    h, W = torch.randn(3, 4, device=dev), torch.randn(5, 4, device=dev)
    ok = torch.tensor([0, 4, -100], device=dev)
    lp, ent, lse = fwd(h, W, ok, None, 0.9, -100, True)
    torch.cuda.synchronize()
"""


@pytest.mark.skipif(DEVICE == "cpu", reason="needs a GPU")
@pytest.mark.parametrize("op", ["fwd", "bwd"])
@pytest.mark.parametrize("ids", ["torch.tensor([0, 5, 1], device=dev)",
                                 "torch.tensor([0, 2**64 - 100, 1], dtype=torch.uint64, "
                                 "device=dev)"])
def test_bad_target_direct_calls_cuda(op, ids):
    from tests.childproc import child_outcomes

    call = ("fwd(h, W, y, None, 0.9, -100, True)" if op == "fwd"
            else "bwd(torch.ones_like(lp), None, h, W, y, None, lse, ent, 0.9, -100)")
    code = _CUDA_ARGS + f"""
    y = {ids}
    print(outcome(lambda: ({call}, torch.cuda.synchronize())))
    """
    (line,) = child_outcomes(code)
    assert line.startswith("RuntimeError"), line


def _grads_on(device, dtype=torch.float32):
    gen = torch.Generator().manual_seed(9)
    h, W, b, y = T._inputs(37, 24, 300, dtype, True, gen)
    leaves = [t.to(device).requires_grad_() for t in (h, W, b)]
    lp, ent = T.linear_token_logprob(leaves[0], leaves[1], y.to(device), bias=leaves[2],
                                     temperature=0.8, return_entropy=True)
    grads = torch.autograd.grad(lp.sum() + ent.sum(), leaves)
    return [lp, ent, *grads]


@pytest.mark.skipif(DEVICE == "cpu", reason="needs a GPU")
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


@pytest.mark.skipif(DEVICE == "cpu" or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_second_gpu_while_the_first_is_current():
    """Tensors on cuda:1 while cuda:0 is current: the kernels must run on cuda:1 (a launch on
    cuda:0 with cuda:1 pointers faults or reads garbage). In a child: a fault may kill it."""
    from tests.childproc import child_outcomes

    code = """
    from tests.ops.test_triton_linear_logprob import _grads_on
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


@pytest.mark.skipif(_RUN_HERE or bool(os.environ.get("_RRL_SUBPROCESS")),
                    reason="the tests already run in this process")
def test_in_fresh_process():
    env = dict(os.environ, TRITON_INTERPRET="1", _RRL_SUBPROCESS="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
