"""The rank-major layout of dim-0 shards, the one rule the weight gathers (trainer/fsdp.py) and
the weight transport's two ends (rollout/transport.py) share.

FSDP2 shards a parameter of d rows as torch.chunk does: rank r holds rows [r·c, (r+1)·c) of
c = ceil(d / world), fewer or none at the end. A rank-major buffer of `world` shards holds, for
each tensor in order, a slot of c·(elements per row) per rank: rank r's shards of every tensor,
then rank r+1's. All-gathering each rank's packed shards produces it in one collective, so the
sender can pass it on as it is and let the receiver cut the full tensors out of it, instead of
holding a second copy of the bucket. With world 1 the slots are the full tensors, back to back."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch


def shard_rows(rows: int, world: int) -> int:
    """Rows of the largest of `world` dim-0 shards of `rows` rows (torch.chunk's)."""
    return -(-rows // world)


def slots(shapes: Sequence[tuple[int, ...]], world: int) -> list[int]:
    """Elements of each tensor's slot in one rank's row of a rank-major buffer."""
    if world == 1:
        return [math.prod(s) for s in shapes]
    return [shard_rows(s[0], world) * math.prod(s[1:]) for s in shapes]


def unpack(buf: torch.Tensor, shapes: Sequence[tuple[int, ...]], world: int) -> Iterator[torch.Tensor]:
    """The full tensors of `shapes` out of the rank-major buffer `buf` (world x sum(slots)
    elements): views of it where a tensor lies whole in one place (world 1, or a lone tensor
    split evenly), else a concatenation of its shards."""
    sizes = slots(shapes, world)
    if buf.numel() != world * sum(sizes):
        raise ValueError(f"a rank-major buffer of {buf.numel()} elements for {len(shapes)} tensors in {world} "
                         f"shards, which take {world * sum(sizes)}")
    rows = buf.view(world, -1)
    if world > 1 and len(shapes) == 1 and shard_rows(shapes[0][0], world) * world == shapes[0][0]:
        yield buf.view(shapes[0])  # even shards of one tensor: the rank-major rows are its rows
        return
    off = 0
    for shape, size in zip(shapes, sizes):
        if world == 1:
            yield rows[0, off:off + size].view(shape)
        else:
            d, c, per_row = shape[0], shard_rows(shape[0], world), math.prod(shape[1:])
            yield torch.cat([rows[k, off:off + max(0, min(c, d - k * c)) * per_row] for k in range(world)]).view(shape)
        off += size
