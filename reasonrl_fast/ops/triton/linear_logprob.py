"""Triton kernels of linear_token_logprob (docs/math.md §Fused LM head).

Forward: one kernel reads tiles of h·Wᵀ (never stored) and keeps, per row and per vocabulary
split, an online max m, the sum S = Σ exp(s − m), the entropy term E = Σ exp(s − m)(s − m) and
the target logit. The splits (O(N) floats each) are merged on the host into lse, lp and the
entropy. Columns past V (V % BLOCK_V != 0) are set to −inf before the max and the sums, so a
ragged last tile never counts as a logit of 0.

Backward: for one vocabulary chunk [c0, c0 + C) at a time, a kernel recomputes the logit tiles
and writes dz = ∂loss/∂z for that chunk only ([N, C] in the input dtype); the host then forms
dh += dz Wᵀ_c and dW[c0:c0+C] = dzᵀ h with two GEMMs. Extra memory: the [N, C] chunk plus
O(N + V), never [N, V].

Launch order: both kernels run on a 1D grid mapped to (row block, vocabulary tile or split) by
`_grouped`. GROUP_N = 0 launches every row block of one column before the next column (all of
h in flight: at N = 16384, H = 4096 in bf16, 128 MiB, more than an H100's 50 MB L2); GROUP_N = g
sweeps the columns with g row blocks at a time, so the programs in flight share g blocks of h
and a few tiles of W (the grouped order of Triton's matmul tutorial). Both are autotuning
candidates on CUDA; the first candidate (taken without autotuning) keeps GROUP_N = 0.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from reasonrl_fast.ops._checks import tracing


@triton.jit
def _logit_tile(h_ptr, w_ptr, b_ptr, rows64, rmask, cols64, cmask, H, stride_hn, stride_wv,
                inv_tau, HAS_BIAS: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
                UPCAST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
                BLOCK_H: tl.constexpr):
    """s = (h[rows] · W[cols]ᵀ + b[cols]) / tau for one [BLOCK_N, BLOCK_V] tile, in ACC.

    UPCAST (interpreter only): Triton 3.7's interpreter returns garbage for tl.dot on
    bfloat16 operands, so there the operands are widened to float32 first (exact: the
    products of two bf16 values are exact in float32, as on tensor cores)."""
    acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=ACC)
    for k0 in range(0, H, BLOCK_H):
        ks = k0 + tl.arange(0, BLOCK_H)
        kmask = ks < H
        a = tl.load(h_ptr + rows64[:, None] * stride_hn + ks[None, :],
                    mask=rmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(w_ptr + cols64[None, :] * stride_wv + ks[:, None],
                    mask=kmask[:, None] & cmask[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PREC, out_dtype=ACC)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols64, mask=cmask, other=0.0).to(ACC)
        acc += bias[None, :]
    return acc * inv_tau


@triton.jit
def _grouped(pid, num_n, num_v, GROUP_N: tl.constexpr):
    """(row block, column) of program `pid` of a 1D grid of num_n x num_v programs: every row
    block of a column before the next column (GROUP_N = 0), or GROUP_N row blocks at a time
    across all the columns, the last group holding what is left."""
    if GROUP_N == 0:
        return pid % num_n, pid // num_n
    in_group = GROUP_N * num_v
    first = (pid // in_group) * GROUP_N
    size = tl.minimum(num_n - first, GROUP_N)
    local = pid % in_group
    return first + local % size, local // size


@triton.jit
def _fwd_kernel(h_ptr, w_ptr, b_ptr, y_ptr, m_ptr, s_ptr, e_ptr, t_ptr,
                N, V, H, stride_hn, stride_wv, tau_ptr, N_BUCKET, SPLITS,
                HAS_BIAS: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
                UPCAST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
                BLOCK_H: tl.constexpr, GROUP_N: tl.constexpr):
    pid_n, pid_s = _grouped(tl.program_id(0), tl.cdiv(N, BLOCK_N), SPLITS, GROUP_N)
    inv_tau = tl.load(tau_ptr)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    rows64 = rows.to(tl.int64)
    y = tl.load(y_ptr + rows64, mask=rmask, other=-1)
    # The vocabulary is cut into SPLITS ranges of whole BLOCK_V tiles; the last ranges may be
    # empty (then the split stays m = -inf, S = 0, which merges as nothing).
    v_per_split = tl.cdiv(tl.cdiv(V, BLOCK_V), SPLITS) * BLOCK_V
    v_begin = pid_s * v_per_split
    v_end = tl.minimum(v_begin + v_per_split, V)
    m = tl.full([BLOCK_N], float("-inf"), dtype=ACC)
    S = tl.zeros([BLOCK_N], dtype=ACC)
    E = tl.zeros([BLOCK_N], dtype=ACC)
    T = tl.zeros([BLOCK_N], dtype=ACC)
    for v0 in range(v_begin, v_end, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        cmask = cols < v_end
        cols64 = cols.to(tl.int64)
        s = _logit_tile(h_ptr, w_ptr, b_ptr, rows64, rmask, cols64, cmask, H, stride_hn,
                        stride_wv, inv_tau, HAS_BIAS, ACC, PREC, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H)
        s = tl.where(cmask[None, :], s, float("-inf"))  # masked columns: -inf, not 0
        T += tl.sum(tl.where(cols64[None, :] == y[:, None], s, 0.0), axis=1)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        # alpha = 0 (an old maximum like a dtype minimum): the old terms vanish; computed,
        # (m - m_safe) * S overflows to -inf and 0 * -inf is NaN
        E = tl.where((S > 0) & (alpha > 0), alpha * (E + tl.where(S > 0, m - m_safe, 0.0) * S), 0.0)
        S = alpha * S
        p = tl.exp(s - m_safe[:, None])
        d = tl.where(p > 0, s - m_safe[:, None], 0.0)  # 0 * log 0 = 0
        S += tl.sum(p, axis=1)
        E += tl.sum(p * d, axis=1)
        m = m_new
    out = pid_s.to(tl.int64) * N + rows64
    tl.store(m_ptr + out, m, mask=rmask)
    tl.store(s_ptr + out, S, mask=rmask)
    tl.store(e_ptr + out, E, mask=rmask)
    tl.store(t_ptr + out, T, mask=rmask)


@triton.jit
def _dz_kernel(h_ptr, w_ptr, b_ptr, y_ptr, glp_ptr, gent_ptr, lse_ptr, mean_ptr, dz_ptr,
               N, V, H, c0, c1, stride_hn, stride_wv, stride_dz, tau_ptr, ignore_index, N_BUCKET,
               HAS_BIAS: tl.constexpr, HAS_ENT: tl.constexpr, ACC: tl.constexpr,
               PREC: tl.constexpr, UPCAST: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, GROUP_N: tl.constexpr):
    pid_n, pid_v = _grouped(tl.program_id(0), tl.cdiv(N, BLOCK_N), tl.cdiv(c1 - c0, BLOCK_V), GROUP_N)
    inv_tau = tl.load(tau_ptr)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    rows64 = rows.to(tl.int64)
    cols = c0 + pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    cmask = cols < c1
    cols64 = cols.to(tl.int64)
    y = tl.load(y_ptr + rows64, mask=rmask, other=ignore_index)
    s = _logit_tile(h_ptr, w_ptr, b_ptr, rows64, rmask, cols64, cmask, H, stride_hn, stride_wv,
                    inv_tau, HAS_BIAS, ACC, PREC, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H)
    lse = tl.load(lse_ptr + rows64, mask=rmask, other=0.0)
    glp = tl.load(glp_ptr + rows64, mask=rmask, other=0.0)
    p = tl.exp(s - lse[:, None])
    g = glp[:, None] * (tl.where(cols64[None, :] == y[:, None], 1.0, 0.0) - p)
    if HAS_ENT:
        gent = tl.load(gent_ptr + rows64, mask=rmask, other=0.0)
        mean = tl.load(mean_ptr + rows64, mask=rmask, other=0.0)
        # A masked column (s = -inf) has p = 0 and no gradient: 0 * (-inf) would be NaN.
        g -= gent[:, None] * p * tl.where(p > 0, s - mean[:, None], 0.0)
    g = g * inv_tau
    g = tl.where((y != ignore_index)[:, None], g, 0.0)
    tl.store(dz_ptr + rows64[:, None] * stride_dz + (cols64 - c0)[None, :],
             g.to(dz_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


def _types(dtype, device):
    if dtype == torch.float64:
        return tl.float64, "ieee"
    if dtype == torch.float32:
        # As torch.matmul does for float32: TF32 tensor cores only when the user allowed them.
        tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
        return tl.float32, "tf32" if tf32 else "ieee"
    return tl.float32, "tf32"  # bf16 / fp16 operands: the precision flag is unused


def _inv_tau(temperature, dtype, like):
    # A Python float reaches a Triton kernel as float32: 1/tau would be rounded to 24 bits,
    # too coarse for float64 inputs. A one-element tensor keeps the accumulation dtype.
    return torch.full((1,), 1.0 / temperature, dtype=dtype, device=like.device)


def _config(bn, bv, bh, warps, stages, group=0):
    return triton.Config(dict(BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=bh, GROUP_N=group), num_warps=warps,
                         num_stages=stages)


# Tile candidates for CUDA, benchmarked on the card at the first call of each (H, V, dtype,
# N rounded up to a power of two). Shared memory per pipeline stage is
# (BLOCK_N + BLOCK_V) * BLOCK_H * itemsize: the 16-bit candidates stay within an H100/H200's
# 227 KiB with their stage counts, and the first of each list fits an A100's 163 KiB.
# The grouped launch order (GROUP_N = 8) is a candidate beside the first tiles: the card's own
# timing decides whether keeping h in L2 beats sharing each W tile across all row blocks.
_CONFIGS = {
    torch.float64: [_config(64, 64, 32, 4, 2), _config(32, 64, 32, 4, 2)],
    torch.float32: [_config(128, 128, 32, 8, 3), _config(64, 128, 32, 4, 3),
                    _config(128, 64, 32, 4, 4), _config(128, 256, 32, 8, 3),
                    _config(128, 128, 32, 8, 3, group=8)],
    "16bit": [_config(128, 128, 64, 8, 3), _config(128, 256, 64, 8, 3),
              _config(256, 128, 64, 8, 3), _config(128, 128, 64, 4, 4),
              _config(64, 256, 64, 4, 4), _config(128, 256, 32, 8, 4),
              _config(128, 128, 64, 8, 3, group=8), _config(128, 256, 64, 8, 3, group=8),
              _config(256, 128, 64, 8, 3, group=8)],
}
_KEY = ["H", "V", "N_BUCKET"]
_fwd_tuned = {k: triton.autotune(configs=c, key=_KEY)(_fwd_kernel) for k, c in _CONFIGS.items()}
_dz_tuned = {k: triton.autotune(configs=c, key=_KEY)(_dz_kernel) for k, c in _CONFIGS.items()}

# Interpreter (tests on CPU): tl.dot needs >= 16 in every dimension; small blocks keep tests
# quick, and no autotuning.
_INTERP = dict(BLOCK_N=16, BLOCK_V=16, BLOCK_H=16, GROUP_N=0)


def _kernel(tuned, plain, hidden):
    """The kernel to launch and the extra meta-parameters it takes at the call.

    REASONRL_TRITON_AUTOTUNE=0 takes the first candidate without benchmarking: each candidate
    compiles in seconds and every new (H, V, N bucket) is benchmarked again, which a test
    suite of many small shapes cannot afford. REASONRL_TRITON_GROUP_N sets the launch order
    there (see the module docstring)."""
    dtype = hidden.dtype
    # REASONRL_TRITON_GROUP_N: the launch order where nothing is autotuned (tests, --quick)
    group = {"GROUP_N": int(os.environ["REASONRL_TRITON_GROUP_N"])} if os.environ.get("REASONRL_TRITON_GROUP_N") else {}
    if hidden.device.type == "cuda":
        key = dtype if dtype in (torch.float32, torch.float64) else "16bit"
        if os.environ.get("REASONRL_TRITON_AUTOTUNE", "1") == "0":
            first = _CONFIGS[key][0]
            return plain, dict(first.kwargs, UPCAST=False, num_warps=first.num_warps,
                               num_stages=first.num_stages, **group)
        return tuned[key], {"UPCAST": False}
    return plain, dict(_INTERP, UPCAST=dtype in (torch.bfloat16, torch.float16), **group)


def _n_bucket(N, t):
    # The autotuning key: N to the next power of two, so that batches of nearby sizes share
    # one tuning run. Under torch.compile a fixed value, which keeps N symbolic.
    if tracing(t):
        return 0
    return 1 << max(N - 1, 0).bit_length()


def _splits(N, V, t):
    """How many vocabulary ranges the forward reduces separately (merged on the host)."""
    if splits_env := os.environ.get("REASONRL_TRITON_SPLITS"):
        return int(splits_env)  # tests force several splits
    tiles = -(-V // 128)
    if tracing(t):
        # A function of V alone: a choice that depends on N would pin N under dynamic shapes.
        return max(1, min(tiles // 8, 16))
    # Enough programs to fill an H100/H200 (132 SMs) a few times over, each with >= 8 tiles.
    return max(1, min(tiles // 8, -(-528 // max(-(-N // 128), 1))))


def forward_partials(hidden, weight, bias, target, temperature, splits=None, wrap=None):
    """Per-split (m, S, E, T) [splits, N] in the accumulation dtype (see module docstring)."""
    wrap = wrap or (lambda k: k)
    N, H = hidden.shape
    V = weight.shape[0]
    acc_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    ACC, PREC = _types(hidden.dtype, hidden.device)
    splits = max(1, splits if splits is not None else _splits(N, V, hidden))
    parts = torch.empty((4, splits, N), dtype=acc_dtype, device=hidden.device)
    if N == 0:
        return parts
    kernel, extra = _kernel(_fwd_tuned, _fwd_kernel, hidden)
    b = bias if bias is not None else hidden  # dummy pointer when HAS_BIAS is False
    wrap(kernel)[lambda meta: (triton.cdiv(N, meta["BLOCK_N"]) * splits,)](
        hidden, weight, b, target, parts[0], parts[1], parts[2], parts[3],
        N, V, H, hidden.stride(0), weight.stride(0), _inv_tau(temperature, acc_dtype, hidden),
        _n_bucket(N, hidden), splits, HAS_BIAS=bias is not None, ACC=ACC, PREC=PREC, **extra)
    return parts


def chunk_dz(hidden, weight, bias, target, grad_lp, grad_ent, lse, mean_s, temperature,
             ignore_index, c0, c1, out, wrap=None):
    """Writes dz[:, c0:c1] (the gradient w.r.t. those logits) into out [N, >= c1 - c0]."""
    wrap = wrap or (lambda k: k)
    N, H = hidden.shape
    V = weight.shape[0]
    if N == 0 or c1 <= c0:
        return out
    ACC, PREC = _types(hidden.dtype, hidden.device)
    kernel, extra = _kernel(_dz_tuned, _dz_kernel, hidden)
    b = bias if bias is not None else hidden
    has_ent = grad_ent is not None
    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]) * triton.cdiv(c1 - c0, meta["BLOCK_V"]),)  # noqa: E731
    wrap(kernel)[grid](
        hidden, weight, b, target, grad_lp, grad_ent if has_ent else grad_lp, lse,
        mean_s if has_ent else lse, out, N, V, H, c0, c1, hidden.stride(0), weight.stride(0),
        out.stride(0), _inv_tau(temperature, lse.dtype, hidden), ignore_index, _n_bucket(N, hidden),
        HAS_BIAS=bias is not None, HAS_ENT=has_ent, ACC=ACC, PREC=PREC, **extra)
    return out
