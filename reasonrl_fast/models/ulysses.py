"""Ulysses sequence parallel: one packed row's tokens split over the ranks of a sequence-parallel
group, each rank running the decoder on its share; at each attention an all-to-all trades the
sequence split for a head split, so that every rank attends over the whole row for its share of
the heads, and a second all-to-all trades back (DeepSpeed-Ulysses, arXiv:2309.14509; verl's
`ulysses_sequence_parallel_size`). Everything but attention works on a token by itself, so it
runs on the rank's share unchanged.

- `all_to_all` / `sum_shares`: the collectives, each with its backward (the reverse all-to-all;
  the gradient as it is).
- `attention`: registered with transformers as the attention implementation "ulysses" (set on a
  model by `use_ulysses`); it reads the group and the row's sequences from the keyword
  `row(...)` gives the model's call.
- `shard(ids, position_ids, group)`: the rank's share of a packed row (padded to a multiple of
  the group's size) and where the row's sequences lie, which each attention needs: the rank's
  share alone does not say where a sequence that crosses into it began.

Heads: the group's size must divide the query heads. Key/value heads it does not divide are
repeated first, the fewest times that make them divisible, as verl does (Qwen2.5-1.5B has 12
query and 2 key/value heads: at 4 ranks each key/value head is repeated twice; Qwen2.5-32B's 40
and 8 split 8 ways as they are).

Attention runs per sequence, each a causal sdpa over its own tokens (no [T, T] mask). On a GPU
with many short sequences in a row, flash-attn's variable-length kernel would take them in one
call; that path is not built.

The contract, checked in tests/models/test_ulysses.py on two gloo ranks: the hidden states
gathered from the ranks equal a plain forward's, and the parameters' gradients summed over the
group equal a plain backward's (each rank's parameters see only its tokens' share).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

NAME = "ulysses"


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """`x` cut into the group's size along `scatter_dim`, piece i sent to rank i, and the pieces
    received concatenated along `gather_dim` in rank order; differentiable (the reverse trade)."""
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    n = dist.get_world_size(group)
    send = torch.stack([c.contiguous() for c in x.chunk(n, dim=scatter_dim)])
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # gloo has the single-tensor form only
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def sum_shares(x: torch.Tensor, group) -> torch.Tensor:
    """The sum over the group of tensors each rank filled on its own tokens' places (zeros
    elsewhere): the whole, the same on every rank. What follows is computed alike on every rank,
    so a rank's gradient is the gathered one, unsummed."""
    return _SumShares.apply(x, group)


class _SumShares(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


@dataclass
class _Row:
    group: object
    bounds: list[tuple[int, int]]  # each sequence's [start, end) in the whole row


ROW = "ulysses_row"
"""The keyword the row travels under, from the model's call to each attention's."""


def row(group, bounds: list[tuple[int, int]]) -> dict:
    """The keyword arguments of a forward over a rank's share of a row (`model(..., **row(group,
    bounds))`): the group and where the row's sequences lie, which `attention` reads. transformers
    hands a model's extra keyword arguments down to each attention, and activation checkpointing
    keeps them with the layer's inputs, so a layer recomputed in the backward reads the same row."""
    return {ROW: _Row(group, bounds)}


def sequence_bounds(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each sequence of a packed row [1, T] whose position ids restart at 0 for
    each sequence (one host read of the row's starts)."""
    starts = (position_ids[0] == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        raise ValueError("a packed row's position ids start at 0, and restart at 0 for each sequence")
    return list(zip(starts, starts[1:] + [position_ids.shape[-1]]))


def shard(input_ids: torch.Tensor, position_ids: torch.Tensor, group, pad_id: int = 0):
    """(this rank's input ids [1, T/n], its position ids, the row's sequence bounds, T): a packed
    row [1, T] padded to a multiple of the group's size n (the padding: sequences of their own,
    one token each, so that no real token attends to them) and cut into n equal shares."""
    if input_ids.shape[0] != 1:
        raise ValueError(f"sequence parallel cuts one packed row, got {input_ids.shape[0]}")
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    t = input_ids.shape[-1]
    pad = -t % n
    if pad:
        input_ids = F.pad(input_ids, (0, pad), value=pad_id)
        position_ids = F.pad(position_ids, (0, pad), value=0)
    share = input_ids.shape[-1] // n
    cut = slice(rank * share, (rank + 1) * share)
    return input_ids[:, cut], position_ids[:, cut], sequence_bounds(position_ids), t


def kv_repeats(kv_heads: int, size: int) -> int:
    """How many times each key/value head is repeated so that `size` ranks divide them."""
    return size // math.gcd(kv_heads, size)


def group_of(rank: int, world: int, size: int):
    """The sequence-parallel group of `rank`: `size` consecutive ranks of `world` (each rank
    creates every group, as torch.distributed asks)."""
    groups = [dist.new_group(list(range(first, first + size))) for first in range(0, world, size)]
    return groups[rank // size]


def gather_samples(group, *columns: list) -> list[list]:
    """Each column (a list of this rank's samples) as the group's: every rank's, in rank order.
    The ranks of a group train on the same samples, each on its share of every row's tokens."""
    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, columns, group=group)
    return [[x for part in parts for x in part[c]] for c in range(len(columns))]


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface ([1, H, t, D] each, the rank's t tokens): heads traded
    for tokens, causal attention over each of the row's sequences in turn, and back; returns
    ([1, t, H, D], None) as transformers' own implementations do. Each sequence is a causal sdpa
    of its own, the variable-length attention flash-attn does in one kernel: no [T, T] mask, and
    sdpa's fused kernels (flash on CPU) keep a sequence's memory linear in its length."""
    row = kwargs.get(ROW)
    if row is None:
        raise RuntimeError("attention 'ulysses' without its row: call the model with **ulysses.row(group, bounds), "
                           "the group and the row's sequences")
    n = dist.get_world_size(row.group)
    r = kv_repeats(key.shape[1], n)
    if r > 1:
        key, value = key.repeat_interleave(r, dim=1), value.repeat_interleave(r, dim=1)
    # [1, H, t, D] -> [1, H/n, T, D]: the rank's heads over the whole row
    q, k, v = (all_to_all(x, 1, 2, row.group) for x in (query, key, value))
    drop = dropout if module.training else 0.0
    out = torch.cat([F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], dropout_p=drop,
                                                    is_causal=True, scale=scaling, enable_gqa=k.shape[1] != q.shape[1])
                     for a, b in row.bounds], dim=2)
    out = all_to_all(out, 2, 1, row.group)  # back to all heads over the rank's tokens
    return out.transpose(1, 2).contiguous(), None


def use_ulysses(model) -> None:
    """Registers `attention` with transformers and sets it as `model`'s attention."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, attention)
    model.set_attn_implementation(NAME)
