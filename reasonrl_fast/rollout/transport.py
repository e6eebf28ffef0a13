"""The weight transport of split placement: a gloo group of its own (its own TCPStore, no
default group involved) over the trainer's rank 0 (transport rank 0, the sender) and every
rollout worker (ranks 1..R). The trainer's workers gather the full tensors one bucket at a time
(trainer/fsdp.py `iter_full`, a collective over their own group); rank 0 packs each bucket into
one flat buffer and broadcasts it, the rollout workers unpack it into their engines. Each publish
starts with a header (its version, the tensor count) that a receiver checks against what it
expects, so a sender and a receiver out of step fail at once instead of loading wrong weights.
The header is an all-reduce, which ends only once every rank is in the publish: the sender times
the transfer from there, without its wait for a rollout worker still generating.

Both sides cut the same buckets from the same metadata (`buckets`): the names, shapes and the one
dtype sent, which the trainer's rank 0 gives the driver once at setup. The buffers travel on the
CPU (gloo): on GPU nodes NCCL would be faster (verl and vLLM build a stateless NCCL communicator
for this); the protocol would not change."""

from __future__ import annotations

import datetime
import math
import socket
import time

import torch
import torch.distributed as dist

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

    def send(self, named, meta: Meta, version: int, dtype: torch.dtype, bucket_bytes: int) -> tuple[int, float]:
        """Rank 0: broadcast the (name, full tensor)s of `named` (in `meta`'s order, each cast to
        `dtype`) as version `version`, a bucket at a time; returns (the bytes sent, the seconds
        from the moment every receiver had joined: the gathers, casts and broadcasts)."""
        self._header(version, len(meta))
        t0 = time.perf_counter()
        it = iter(named)
        sent = 0
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
            self._broadcast(flat)
            sent += flat.numel() * flat.element_size()
        return sent, time.perf_counter() - t0

    def receive(self, meta: Meta, version: int, dtype: torch.dtype, bucket_bytes: int):
        """Ranks 1..: the (name, tensor)s of version `version`, a bucket at a time (each tensor
        a view of its bucket's buffer: a consumer copies it before the next arrives)."""
        got, count = self._header(0, 0)
        if (got, count) != (version, len(meta)):
            raise RuntimeError(f"weight transport: version {got} with {count} tensors arrived where version "
                               f"{version} with {len(meta)} was expected")
        for idx in buckets(meta, dtype.itemsize, bucket_bytes):
            flat = torch.empty(sum(math.prod(meta[i][1]) for i in idx), dtype=dtype)
            self._broadcast(flat)
            off = 0
            for i in idx:
                name, shape = meta[i]
                n = math.prod(shape)
                yield name, flat[off:off + n].view(shape)
                off += n

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
