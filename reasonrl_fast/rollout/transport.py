"""The weight transport of split placement: a gloo group of its own (its own TCPStore, no
default group involved) over the trainer's rank 0 (transport rank 0, the sender) and every
rollout worker (ranks 1..R). The trainer's workers gather their shards one bucket at a time
(trainer/fsdp.py `gather_rank_major`, a collective over their own group) into one buffer in the
rank-major layout (runtime/shards.py); rank 0 broadcasts that buffer as it is, and the rollout
workers cut the full tensors out of it into their engines. So a trainer rank holds its shard and
one bucket, never a second copy of the bucket. Each publish starts with a header (its version,
the tensor count) that a receiver checks against what it expects, so a sender and a receiver out
of step fail at once instead of loading wrong weights. The header is an all-reduce, which ends
only once every rank is in the publish: the sender times the transfer from there, without its
wait for a rollout worker still generating.

Both sides cut the same buckets from the same metadata (`buckets`): the names, shapes, the one
dtype sent and the layout's shard count, which the trainer's rank 0 gives the driver once at
setup. The buffers travel on the CPU (gloo): on GPU nodes NCCL would be faster (verl and vLLM
build a stateless NCCL communicator for this); the protocol would not change."""

from __future__ import annotations

import datetime
import math
import socket
import time

import torch
import torch.distributed as dist

from reasonrl_fast.runtime import shards
from reasonrl_fast.runtime.distributed import loopback_store

Meta = list[tuple[str, tuple[int, ...]]]  # (name, shape) in the order the sender sends them


def buckets(meta: Meta, itemsize: int, bucket_bytes: int) -> list[list[int]]:
    """The tensors of `meta` in buckets of consecutive indices, each closed once it holds
    `bucket_bytes` or more (a tensor that large alone): the sender's and receivers' one rule."""
    out, cur, size = [], [], 0
    for i, (_, shape) in enumerate(meta):
        nbytes = math.prod(shape) * itemsize
        if cur and nbytes >= bucket_bytes:
            out.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += nbytes
        if size >= bucket_bytes:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return out


def pack(named, meta: Meta, dtype: torch.dtype, bucket_bytes: int):
    """The buffers `Transport.send` takes, from (name, full tensor)s in `meta`'s order: each
    bucket's tensors cast to `dtype` and copied back to back (the layout of one shard)."""
    it = iter(named)
    for idx in buckets(meta, dtype.itemsize, bucket_bytes):
        flat = torch.empty(sum(math.prod(meta[i][1]) for i in idx), dtype=dtype)
        off = 0
        for i in idx:
            name, t = next(it)
            if name != meta[i][0] or tuple(t.shape) != tuple(meta[i][1]):
                raise RuntimeError(f"weight transport: sending {name} {tuple(t.shape)} where the receivers "
                                   f"expect {meta[i][0]} {tuple(meta[i][1])}")
            flat[off:off + t.numel()] = t.reshape(-1)  # cast and moved to the CPU as copied
            off += t.numel()
            del t
        yield flat


class Transport:
    """This process's end of the transport: rank `rank` of `size`, rank 0 serving the store at
    (`host`, `port`) (its `listen` socket, from runtime/distributed.py `rendezvous_socket`, on a
    loopback run). Every rank must construct it at once: gloo's rendezvous connects them all."""

    def __init__(self, host: str, port: int, rank: int, size: int, timeout_s: float,
                 listen: socket.socket | None = None):
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = loopback_store(host, port, rank, size, timeout, listen)
        if self.store is None:  # multi-node
            self.store = dist.TCPStore(host, port, size, rank == 0, timeout)
        self.pg = dist.ProcessGroupGloo(self.store, rank, size, timeout)
        self.rank, self.size = rank, size

    def _broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([t], opts).wait()

    def _header(self, version: int, count: int) -> tuple[int, int]:
        """(version, tensor count) as the sender gives them (0s from a receiver): summed over
        every rank, so it returns on each only once all have joined."""
        head = torch.tensor([version, count], dtype=torch.int64)
        self.pg.allreduce([head]).wait()
        got, n = head.tolist()
        return got, n

    def send(self, bufs, meta: Meta, version: int, dtype: torch.dtype, bucket_bytes: int,
             world: int = 1) -> tuple[int, float]:
        """Rank 0: broadcast version `version`, a bucket at a time: `bufs` yields each bucket of
        `buckets(meta, ...)` as one flat buffer of `dtype` in the rank-major layout of `world`
        shards (runtime/shards.py: the trainer's gathered buffer as it is; `pack` makes them
        from full tensors). Returns (the bytes sent, the seconds from the moment every receiver
        had joined: the gathers, casts and broadcasts)."""
        self._header(version, len(meta))
        t0 = time.perf_counter()
        it = iter(bufs)
        sent = 0
        for idx in buckets(meta, dtype.itemsize, bucket_bytes):
            flat = next(it)
            want = world * sum(shards.slots([meta[i][1] for i in idx], world))
            if flat.dtype != dtype or flat.numel() != want:
                raise RuntimeError(f"weight transport: a bucket of {flat.numel()} {flat.dtype} elements where the "
                                   f"receivers expect {want} {dtype} ({meta[idx[0]][0]}...: {len(idx)} tensors in "
                                   f"{world} shards)")
            flat = flat.cpu()
            self._broadcast(flat)
            sent += flat.numel() * flat.element_size()
            del flat
        return sent, time.perf_counter() - t0

    def receive(self, meta: Meta, version: int, dtype: torch.dtype, bucket_bytes: int, world: int = 1):
        """Ranks 1..: the (name, tensor)s of version `version`, a bucket at a time, cut out of the
        rank-major buffer of `world` shards the sender broadcasts (each tensor a view of its
        bucket's buffer or a copy: a consumer copies it before the next arrives)."""
        got, count = self._header(0, 0)
        if (got, count) != (version, len(meta)):
            raise RuntimeError(f"weight transport: version {got} with {count} tensors arrived where version "
                               f"{version} with {len(meta)} was expected")
        for idx in buckets(meta, dtype.itemsize, bucket_bytes):
            shapes = [meta[i][1] for i in idx]
            flat = torch.empty(world * sum(shards.slots(shapes, world)), dtype=dtype)
            self._broadcast(flat)
            yield from zip([meta[i][0] for i in idx], shards.unpack(flat, shapes, world))

    def close(self) -> None:
        self.pg = None
        self.store = None


def checksum(named) -> float:
    """A float64 checksum of (name, tensor)s, position-weighted so that swapped values differ:
    both ends of the transport compute it over what they hold (tests)."""
    total = 0.0
    for _, t in sorted(named, key=lambda x: x[0]):
        flat = t.detach().reshape(-1).to(torch.float64).cpu()
        total += float((flat * torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64)).sum())
    return total
