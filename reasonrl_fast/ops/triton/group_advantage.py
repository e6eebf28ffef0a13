"""An O(B) Triton kernel of group_advantage (docs/math.md §Group advantage), bitwise equal to
the CPU kernel (csrc/group_advantage.cpp).

Algorithm: the CPU kernel's, parallel over groups. The host sorts the ids once,
`torch.sort(ids, stable=True)` (a radix sort on CUDA, O(B)); in sorted order each group is a
contiguous run, and within a run the positions keep their index order because the sort is
stable. Then ONE launch, one lane per sorted position: a lane whose position starts a run
(the first position, or an id unlike its predecessor's) walks that run sequentially, one
response per step, in float64, exactly as the CPU kernel's loops do:

    sum, k  over the run                     (pass 1: also finds where the run ends)
    mean = sum / k;  mean += Σ(r − mean) / k  (pass 2: the correction pass)
    ss = Σ (r − mean)²;  std = sqrt(ss / (k − 1))   (pass 3, only with norm_by_std)
    out[order[i]] = float32((r − mean) / (std + eps))   or float32(r − mean)   (pass 4)

and a run of one gets mean 0, std 1 (verl's rule). The lanes of a program walk in lockstep,
each its own run, so the sums add the same numbers in the same order as the CPU kernel's and
round the same way: the output is bitwise equal. Work is O(B) (each response is read four
times), but the span is the longest group: the kernel is made for many small groups (the n
samples of each prompt), not for one group of the whole batch, which a single lane would walk.

Rounding on the GPU: the launch disables floating-point contraction (`enable_fp_fusion=False`),
so ss + d * d is not fused into an fma (which rounds once, where the CPU rounds twice); float64
division and square root compile to the IEEE-rounded div.rn.f64 and sqrt.rn.f64 (PTX has no
approximate float64 forms of them). eps reaches the kernel as the bits of the float64: a Python
float argument would be passed as float32.

Whether the op uses this kernel on CUDA is for a measurement on a card to decide: the op's CUDA
kernel (csrc/kernels/group_advantage.cu) stays the default until then, and
benchmarks/bench_group_advantage.py times this one as the provider "triton_sorted".
"""

from __future__ import annotations

import contextlib
import struct

import torch
import triton
import triton.language as tl

from reasonrl_fast.ops.group_advantage import check_inputs


@triton.jit
def _load_reward(r_ptr, order_ptr, i, mask):
    # Reward of sorted position i, widened to float64 (exact for every float dtype).
    o = tl.load(order_ptr + i, mask=mask, other=0)
    return tl.load(r_ptr + o, mask=mask, other=0.0).to(tl.float64), o


# eps_bits is never specialised (a value of 1, the smallest subnormal, would become a constant).
@triton.jit(do_not_specialize=["eps_bits"])
def _group_adv_kernel(ids_ptr, order_ptr, r_ptr, out_ptr, B, eps_bits,
                      NORM_BY_STD: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = p < B
    g = tl.load(ids_ptr + p, mask=live, other=0)
    prev = tl.load(ids_ptr + p - 1, mask=live & (p > 0), other=0)
    start = live & ((p == 0) | (g != prev))

    # Pass 1: the sum and the length k of the run that starts here (0 for lanes that start none).
    s = tl.zeros([BLOCK], dtype=tl.float64)
    k = tl.zeros([BLOCK], dtype=tl.int64)
    walking = start
    while tl.max(walking.to(tl.int32), axis=0) > 0:
        x, _ = _load_reward(r_ptr, order_ptr, p + k, walking)
        s = tl.where(walking, s + x, s)
        k = tl.where(walking, k + 1, k)
        nxt = p + k
        more = walking & (nxt < B)
        walking = more & (tl.load(ids_ptr + nxt, mask=more, other=0) == g)
    kmax = tl.max(k, axis=0)
    kf = tl.where(k > 0, k, 1).to(tl.float64)  # lanes that start no run: never used
    mean = s / kf

    # Pass 2: the CPU kernel's correction of the mean (exact means for equal rewards).
    c = tl.zeros([BLOCK], dtype=tl.float64)
    for j in range(0, kmax):
        m = start & (j < k)
        x, _ = _load_reward(r_ptr, order_ptr, p + j, m)
        c = tl.where(m, c + (x - mean), c)
    mean = tl.where(k > 1, mean + c / kf, 0.0)  # a run of one: mean 0

    std = tl.full([BLOCK], 1.0, dtype=tl.float64)  # a run of one: std 1
    if NORM_BY_STD:
        # Pass 3: squared deviations from the corrected mean (two passes: no cancellation).
        ss = tl.zeros([BLOCK], dtype=tl.float64)
        for j in range(0, kmax):
            m = start & (j < k)
            x, _ = _load_reward(r_ptr, order_ptr, p + j, m)
            d = x - mean
            ss = tl.where(m, ss + d * d, ss)
        km1 = tl.where(k > 1, k - 1, 1).to(tl.float64)
        std = tl.where(k > 1, tl.sqrt(ss / km1), std)  # unbiased, as torch.std
    # An argument that fits in 32 bits (eps = 0.0) arrives as int32: widen before the bitcast.
    eps = eps_bits.to(tl.int64).to(tl.float64, bitcast=True)
    den = std + eps

    # Pass 4: the advantages, written back to the responses' own positions.
    for j in range(0, kmax):
        m = start & (j < k)
        x, o = _load_reward(r_ptr, order_ptr, p + j, m)
        a = x - mean
        if NORM_BY_STD:
            a = a / den
        tl.store(out_ptr + o, a.to(tl.float32), mask=m)


# The CUDA launch: one thread per sorted position; no fused multiply-adds (module docstring).
# Not tuned yet: a first guess, for the measurement on a card to revise.
CUDA_BLOCK = 128
CUDA_LAUNCH = dict(num_warps=4, enable_fp_fusion=False)


def group_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6,
                    norm_by_std: bool = True, block: int | None = None) -> torch.Tensor:
    """reasonrl_fast.ops.group_advantage computed by the Triton kernel (module docstring):
    float32 [B], bitwise equal to the CPU kernel's output.

    Runs on CUDA tensors, or on CPU tensors in Triton's interpreter (TRITON_INTERPRET=1 set
    before triton is imported). block: sorted positions per program (a power of two)."""
    check_inputs(rewards, group_ids, eps)
    B = rewards.shape[0]
    out = torch.empty(B, dtype=torch.float32, device=rewards.device)
    if B == 0:
        return out
    # int32 and int64 ids are sorted as they are; other integer types widen, as the CPU kernel
    # widens every id to int64 (so uint64 ids order as their int64 bit patterns, there too).
    ids = group_ids if group_ids.dtype in (torch.int32, torch.int64) else group_ids.to(torch.int64)
    sorted_ids, order = torch.sort(ids, stable=True)
    cuda = rewards.device.type == "cuda"
    block = block or (CUDA_BLOCK if cuda else 32)
    eps_bits = struct.unpack("<q", struct.pack("<d", float(eps)))[0]
    launch = CUDA_LAUNCH if cuda else {}
    with torch.cuda.device(rewards.device) if cuda else contextlib.nullcontext():
        _group_adv_kernel[(triton.cdiv(B, block),)](
            sorted_ids, order, rewards.contiguous(), out, B, eps_bits,
            NORM_BY_STD=bool(norm_by_std), BLOCK=block, **launch)
    return out

