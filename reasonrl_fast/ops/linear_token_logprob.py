"""linear_token_logprob: token_logprob(hidden @ weight.T + bias) without the [N, V] logits.

docs/math.md §Fused LM head. Two custom ops, `reasonrl_fast::linear_token_logprob` and
`reasonrl_fast::linear_token_logprob_backward`, declared from Python with
torch.library.triton_op (so torch.compile sees the Triton kernels through wrap_triton) when
triton is installed and its kernels can run (`_triton_wanted`), else with torch.library.custom_op.

Implementations:
- CUDA tensors: the Triton kernels of reasonrl_fast/ops/triton/linear_logprob.py.
- CPU tensors: the vocabulary is cut into chunks of C columns; each chunk's logits [N, C] are
  formed with one GEMM and reduced by the CPU token_logprob kernels (forward: a running
  log-sum-exp, entropy mean and target logit per row; backward: the chunk's dz, then
  dh += dz W_c and dW[c] = dzᵀ h). Extra memory: one [N, C + 1] chunk, O(N) statistics,
  a float32 [N, H] accumulator for dh, and dW.
- CPU tensors with REASONRL_TRITON_CPU=1 (and TRITON_INTERPRET=1 set before triton is
  imported): the Triton kernels in Triton's interpreter. This is how the Triton code is
  tested without a GPU.

Chunk width: REASONRL_LINEAR_LOGPROB_CHUNK (columns) overrides the default.
CUDA tiles: autotuned on the card among a few candidates at the first call of each (H, V,
dtype, N rounded up to a power of two); REASONRL_TRITON_AUTOTUNE=0 takes the first candidate.
Ignored rows (ignore_index) are dropped before any logit is formed, except under
torch.compile and tracing, where that would make N data-dependent.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Optional

import torch

from reasonrl_fast.util import chunk_width
from reasonrl_fast.ops._checks import (acc_dtype, check_linear_backward_inputs, check_linear_inputs,
                                     linear_targets, tracing)

_op = torch.ops.reasonrl_fast


def _triton_wanted() -> bool:
    """Whether this process can run the Triton kernels: a CUDA device, or the kernels routed to
    CPU tensors (REASONRL_TRITON_CPU=1, or Triton's interpreter), set before this module is
    imported. Elsewhere the ops are plain custom ops even where triton is installed (a CPU
    machine): torch.library.triton_op reads the kernels' source through inductor, about half a
    second of the start of every process that imports the ops, for kernels that would never run."""
    return (os.environ.get("REASONRL_TRITON_CPU", "0") == "1" or os.environ.get("TRITON_INTERPRET", "0") == "1"
            or torch.cuda.is_available())


_tk = None
_HAS_TRITON = False
if _triton_wanted():
    try:  # triton is optional: the CPU path does not need it
        import triton  # noqa: F401

        from reasonrl_fast.ops.triton import linear_logprob as _tk

        _HAS_TRITON = True
    except ImportError:  # pragma: no cover - depends on the environment
        pass


def _define(name):
    if _HAS_TRITON:
        return torch.library.triton_op(name, mutates_args=())
    return torch.library.custom_op(name, mutates_args=())


def _use_triton(t: torch.Tensor) -> bool:
    if t.device.type == "cuda":
        if not _HAS_TRITON:
            raise RuntimeError("linear_token_logprob: CUDA tensors need triton installed")
        return True
    if os.environ.get("REASONRL_TRITON_CPU", "0") == "1":
        if not _HAS_TRITON:
            raise RuntimeError("linear_token_logprob: REASONRL_TRITON_CPU=1 needs triton installed and the variable "
                               "set before reasonrl_fast is imported")
        return True
    return False


def _wrap():
    return torch.library.wrap_triton if _HAS_TRITON else None


def _chunk(N: int, H: int, V: int, device: torch.device, tracing: bool = False) -> int:
    return chunk_width(N, H, V, device.type == "cuda", tracing)


def _valid_rows(valid: torch.Tensor) -> Optional[torch.Tensor]:
    """Indices of the rows to compute, or None for all of them. In eager mode the ignored
    rows (padding, prompts) are dropped before any logit is formed: a batch with 40 % padding
    does 40 % less matmul work. Finding them costs one host synchronisation, so under
    torch.compile, where it would also make N data-dependent, every row is computed."""
    if tracing(valid):
        return None
    rows = valid.nonzero().squeeze(1)
    return rows if rows.numel() < valid.numel() else None


def _device_guard(t: torch.Tensor):
    # Triton launches on the current device and stream: make them hidden's.
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


_ROUNDED_ADDMM_WARNED = False


def _addmm_f32(acc, a, b):
    """acc += a @ b with a, b in bf16/fp16 and acc float32, without rounding a @ b to 16 bits
    (aten::addmm.dtype, CUDA). Where that overload is missing, the product is rounded to a's
    dtype before it is added: a loss of precision said once, in a RuntimeWarning."""
    global _ROUNDED_ADDMM_WARNED
    try:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
        return
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, TypeError, NotImplementedError) as e:
        if not _ROUNDED_ADDMM_WARNED:
            _ROUNDED_ADDMM_WARNED = True
            warnings.warn(
                f"linear_token_logprob: torch {torch.__version__} has no float32-output addmm for {a.dtype} on "
                f"{a.device.type} ({type(e).__name__}: {str(e).splitlines()[0][:160]}); the backward's "
                f"gradient of hidden adds products rounded to {a.dtype}, so it is less precise than on a "
                f"torch with aten::addmm.dtype", RuntimeWarning, stacklevel=2)
    acc += a @ b


def _contig(x):
    return x if x is None or x.is_contiguous() else x.contiguous()


def _forward_triton(hidden, weight, tgt, bias, temperature):
    """(lp, ent, lse) from the Triton kernel's per-split partial statistics."""
    parts = _tk.forward_partials(hidden, weight, bias, tgt, temperature, wrap=_wrap())
    m, S, E, T = parts.unbind(0)
    M = m.amax(0)
    Ms = torch.where(M == float("-inf"), torch.zeros_like(M), M)
    w = torch.exp(m - Ms)  # 0 for a split whose columns are all -inf (m = -inf, S = 0)
    s_tot = (w * S).sum(0)
    # a split whose weight underflows to 0 adds nothing (computed, 0 * -inf would be NaN)
    e_tot = torch.where((S > 0) & (w > 0), w * (E + (m - Ms) * S), torch.zeros_like(S)).sum(0)
    lse = Ms + torch.log(s_tot)
    return T.sum(0) - lse, torch.log(s_tot) - e_tot / s_tot, lse


def _forward_chunks(hidden, weight, tgt, bias, temperature, valid, compute_entropy):
    """(lp, ent, lse) in float64, one GEMM and one token_logprob call per vocabulary chunk.

    Running statistics over the chunks seen so far, in float64 (O(N)): log-sum-exp L, the
    entropy Hs of the softmax restricted to those chunks, and the target logit. Merging (L, Hs)
    with a chunk's (l, h): L' = logaddexp(L, l), a = exp(L - L'), b = exp(l - L'),
    Hs' = a Hs + b h - a log a - b log b: every term is >= 0, so the entropy never comes from
    a difference of two large numbers (lse - E[s])."""
    N, H = hidden.shape
    V = weight.shape[0]
    C = _chunk(N, H, V, hidden.device, tracing(hidden))
    f64, ninf = torch.float64, float("-inf")
    lse = torch.full((N,), ninf, dtype=f64)
    hs = torch.zeros((N,), dtype=f64)
    sy = torch.zeros((N,), dtype=f64)
    zero = torch.zeros((), dtype=f64)
    for c0 in range(0, V, C):
        c1 = min(c0 + C, V)
        Wc = weight[c0:c1]
        z = hidden @ Wc.T if bias is None else torch.addmm(bias[c0:c1], hidden, Wc.T)
        inside = valid & (tgt >= c0) & (tgt < c1)
        # Ignored rows are skipped by the kernel (-1); other rows read any in-chunk id.
        loc = torch.where(inside, tgt - c0, torch.where(valid, 0, -1))
        lp_c, ent_c, lse_c = _op.token_logprob(z, loc, temperature, -1, compute_entropy)
        lse_c = lse_c.to(f64)
        # A row whose chunk logits are all -inf (masked columns) has lse_c = -inf: its lp_c
        # and ent_c are undefined (-inf - -inf, 0/0) and the chunk adds nothing, except a
        # target logit of -inf.
        empty = lse_c == ninf
        sy = torch.where(inside, torch.where(empty, ninf, lp_c.to(f64) + lse_c), sy)
        new = torch.logaddexp(lse, lse_c)
        if compute_entropy:
            fin = torch.isfinite(new)
            a = torch.where(fin, torch.exp(lse - new), zero)
            b = torch.where(fin & ~empty, torch.exp(lse_c - new), zero)
            hb = torch.where(b > 0, b * ent_c.to(f64), zero)  # 0 * NaN would poison hs
            hs = a * hs + hb - torch.special.xlogy(a, a) - torch.special.xlogy(b, b)
        lse = new
    return sy - lse, hs, lse


def _forward_impl(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: Optional[torch.Tensor],
    temperature: float,
    ignore_index: int,
    compute_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_linear_inputs("linear_token_logprob", hidden, weight, target, bias, temperature)
    hidden, weight, bias = _contig(hidden), _contig(weight), _contig(bias)
    N = hidden.shape[0]
    acc = acc_dtype(hidden.dtype)
    tgt = linear_targets(target, weight.shape[0], ignore_index)
    if N == 0:
        e = hidden.new_empty((0,), dtype=acc)
        return e, e.clone(), e.clone()
    valid = tgt != ignore_index
    rows = _valid_rows(valid)
    with _device_guard(hidden):
        h, t, v = (hidden, tgt, valid) if rows is None else (hidden[rows], tgt[rows], valid[rows])
        if _use_triton(hidden):
            lp, ent, lse = _forward_triton(h, weight, t, bias, temperature)
        else:
            lp, ent, lse = _forward_chunks(h, weight, t, bias, temperature, v, compute_entropy)
        if rows is not None:  # back to all N rows; the ignored ones are zeroed below
            lp, ent, lse = (x.new_zeros(N).index_copy_(0, rows, x) for x in (lp, ent, lse))
        zero = torch.zeros((), dtype=acc, device=hidden.device)
        lp = torch.where(valid, lp.to(acc), zero)
        lse = torch.where(valid, lse.to(acc), zero)
        ent = torch.where(valid, ent.to(acc), zero) if compute_entropy else lse.new_empty((0,))
    return lp, ent, lse


@_define("reasonrl_fast::linear_token_logprob")
def _linear_token_logprob(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: Optional[torch.Tensor],
    temperature: float,
    ignore_index: int,
    compute_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward_impl(hidden, weight, target, bias, temperature, ignore_index, compute_entropy)


@_linear_token_logprob.register_fake
def _(hidden, weight, target, bias, temperature, ignore_index, compute_entropy):
    check_linear_inputs("linear_token_logprob", hidden, weight, target, bias, temperature)
    acc = acc_dtype(hidden.dtype)
    N = hidden.shape[0]
    lp = hidden.new_empty((N,), dtype=acc)
    ent = hidden.new_empty((N,) if compute_entropy else (0,), dtype=acc)
    return lp, ent, hidden.new_empty((N,), dtype=acc)


def _chunk_dz_cpu(hidden, Wc, bc, tgt, valid, c0, g_lp, g_ent, lse, ent, temperature):
    """dz for the columns of Wc with the CPU token_logprob_backward kernel.

    The chunk's logits in columns [0, cc) and a dummy column cc: rows whose target lies in
    another chunk point at the dummy, whose (discarded) gradient absorbs the 1[j = y] term.
    The kernel takes lse and entropy from the forward, so each column's gradient depends on
    that column only and the dummy's value (0, finite) changes nothing else. Out of place:
    torch.compile traces through this function (triton_op), and mutating views of a buffer
    broke it."""
    cc = Wc.shape[0]
    zc = hidden @ Wc.T if bc is None else torch.addmm(bc, hidden, Wc.T)
    z = torch.cat([zc, zc.new_zeros((zc.shape[0], 1))], dim=1)
    inside = valid & (tgt >= c0) & (tgt < c0 + cc)
    loc = torch.where(inside, tgt - c0, torch.where(valid, cc, -1))
    return _op.token_logprob_backward(g_lp, g_ent, z, loc, lse, ent, temperature, -1)[:, :cc]


def _backward_impl(
    grad_logprob: torch.Tensor,
    grad_entropy: Optional[torch.Tensor],
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: Optional[torch.Tensor],
    lse: torch.Tensor,
    entropy: torch.Tensor,
    temperature: float,
    ignore_index: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dh [N, H], dW [V, H], db [V] or [0] without bias), in the inputs' dtype."""
    check_linear_backward_inputs(grad_logprob, grad_entropy, hidden, weight, target, bias, lse, entropy,
                           temperature)
    hidden, weight, bias = _contig(hidden), _contig(weight), _contig(bias)
    N, H = hidden.shape
    V = weight.shape[0]
    dtype = hidden.dtype
    acc = acc_dtype(dtype)
    tgt = linear_targets(target, V, ignore_index)
    dW = torch.zeros_like(weight)
    db = torch.zeros_like(bias) if bias is not None else weight.new_empty((0,))
    if N == 0:
        return torch.zeros_like(hidden), dW, db
    g_lp = grad_logprob.to(acc).contiguous()
    g_ent = grad_entropy.to(acc).contiguous() if grad_entropy is not None else None
    lse = lse.to(acc).contiguous()
    ent = entropy.to(acc).contiguous() if g_ent is not None else lse.new_empty((0,))
    mean_s = (lse - ent) if g_ent is not None else None
    triton_path = _use_triton(hidden)
    valid = tgt != ignore_index
    rows = _valid_rows(valid)
    full_hidden = hidden
    if rows is not None:  # only the rows that have a gradient (see _valid_rows)
        hidden, tgt, valid, g_lp, lse = hidden[rows], tgt[rows], valid[rows], g_lp[rows], lse[rows]
        if g_ent is not None:
            g_ent, ent, mean_s = g_ent[rows], ent[rows], mean_s[rows]
        N = hidden.shape[0]
    C = _chunk(N, H, V, hidden.device, tracing(hidden))
    with _device_guard(hidden):
        dh = torch.zeros((N, H), dtype=acc, device=hidden.device)
        buf = torch.empty((N, C), dtype=dtype, device=hidden.device) if triton_path else None
        for c0 in range(0, V, C):
            c1 = min(c0 + C, V)
            Wc = weight[c0:c1]
            if triton_path:
                dz = buf[:, :c1 - c0]
                _tk.chunk_dz(hidden, weight, bias, tgt, g_lp, g_ent, lse, mean_s, temperature,
                             ignore_index, c0, c1, dz, wrap=_wrap())
            else:
                bc = bias[c0:c1] if bias is not None else None
                dz = _chunk_dz_cpu(hidden, Wc, bc, tgt, valid, c0, g_lp, g_ent, lse, ent,
                                   temperature)
            if dtype == acc:
                dh.addmm_(dz, Wc)
            elif hidden.device.type == "cpu":
                dh.addmm_(dz.to(acc), Wc.to(acc))
            else:
                _addmm_f32(dh, dz, Wc)
            dW[c0:c1] = dz.T @ hidden
            if bias is not None:
                db[c0:c1] = dz.sum(0, dtype=acc).to(dtype)
    dh = dh.to(dtype)
    if rows is not None:
        dh = torch.zeros_like(full_hidden).index_copy_(0, rows, dh)
    return dh, dW, db


@_define("reasonrl_fast::linear_token_logprob_backward")
def _linear_token_logprob_backward(
    grad_logprob: torch.Tensor,
    grad_entropy: Optional[torch.Tensor],
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: Optional[torch.Tensor],
    lse: torch.Tensor,
    entropy: torch.Tensor,
    temperature: float,
    ignore_index: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dh [N, H], dW [V, H], db [V] or [0] without bias), in the inputs' dtype."""
    return _backward_impl(grad_logprob, grad_entropy, hidden, weight, target, bias, lse, entropy,
                          temperature, ignore_index)


@_linear_token_logprob_backward.register_fake
def _(grad_logprob, grad_entropy, hidden, weight, target, bias, lse, entropy, temperature,
      ignore_index):
    check_linear_backward_inputs(grad_logprob, grad_entropy, hidden, weight, target, bias, lse, entropy,
                           temperature)
    db = torch.empty_like(bias) if bias is not None else weight.new_empty((0,))
    return torch.empty_like(hidden), torch.empty_like(weight), db


def _setup_context(ctx, inputs, output):
    hidden, weight, target, bias, temperature, ignore_index, _ = inputs
    _, ent, lse = output
    ctx.save_for_backward(hidden, weight, target, bias, lse, ent)
    ctx.temperature, ctx.ignore_index = temperature, ignore_index
    ctx.has_bias = bias is not None


def _backward(ctx, grad_lp, grad_ent, _grad_lse):
    hidden, weight, target, bias, lse, ent = ctx.saved_tensors
    if grad_lp is None:
        grad_lp = torch.zeros_like(lse)
    if ent.numel() != lse.numel():
        grad_ent = None
    dh, dW, db = _linear_token_logprob_backward(
        grad_lp, grad_ent, hidden, weight, target, bias, lse, ent, ctx.temperature,
        ctx.ignore_index,
    )
    return dh, dW, None, (db if ctx.has_bias else None), None, None, None


_linear_token_logprob.register_autograd(_backward, setup_context=_setup_context)


def linear_token_logprob(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float = 1.0,
    ignore_index: int = -100,
    bias: Optional[torch.Tensor] = None,
    return_entropy: bool = False,
):
    """token_logprob(hidden @ weight.T + bias, token_ids) without materialising the logits.

    Args:
        hidden: [..., H] floating point (fp32, bf16, fp16 or fp64).
        weight: [V, H], the LM head, same dtype as hidden.
        token_ids: [...] integer ids (hidden's shape without H); ``ignore_index`` rows give 0
            and no gradient.
        temperature: divides the logits; > 0.
        bias: optional [V]. A -inf entry masks its column: probability 0, gradient exactly 0
            (a target on a masked column gets logprob -inf and the finite gradient of
            log_softmax).
        return_entropy: also return the entropy of softmax(logits / temperature).

    Returns:
        logprob [...] float32 (float64 for float64 inputs), and entropy [...] when asked.
        Gradients flow to hidden, weight and bias.

    Raises:
        ValueError: mismatched shapes or devices; temperature <= 0, or so small that
            1/temperature overflows the accumulation dtype; a bad REASONRL_LINEAR_LOGPROB_CHUNK.
        TypeError: a dtype other than float32/bfloat16/float16/float64, hidden, weight and
            bias of different dtypes, non-integer token_ids.
        IndexError: a token id outside [0, V) that is not ignore_index (CPU: at once; CUDA: a
            device-side assertion reported at the next synchronisation).
    """
    # The op validates its arguments; only what the reshape below relies on is checked here.
    if not all(isinstance(t, torch.Tensor) for t in (hidden, weight, token_ids)):
        raise TypeError("linear_token_logprob: hidden, weight and token_ids must be tensors")
    if hidden.dim() < 1 or tuple(hidden.shape[:-1]) != tuple(token_ids.shape):
        raise ValueError(
            f"linear_token_logprob: token_ids shape {tuple(token_ids.shape)} must equal the "
            f"hidden shape {tuple(hidden.shape)} without its last dimension"
        )
    lead = token_ids.shape
    h2 = hidden.reshape(-1, hidden.shape[-1])
    lp, ent, _ = _linear_token_logprob(
        h2, weight, token_ids.reshape(-1), bias, float(temperature), int(ignore_index),
        bool(return_entropy),
    )
    lp = lp.reshape(lead)
    return (lp, ent.reshape(lead)) if return_entropy else lp
