"""Data-parallel helpers: process group, device mesh, FSDP2 sharding one decoder layer at a time,
then the root (so the root holds embeddings, final norm, LM head and the Z-head), or replication
(DDP) where sharding costs more than it saves (`trainer.sharding`), and the weight sync's gathers."""

from __future__ import annotations

import math
import socket

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from reasonrl_fast.layout import SYNC_BUCKET_BYTES
from reasonrl_fast.models.loading import decoder_layers
from reasonrl_fast.runtime.distributed import init_process_group


def init_distributed(rank: int, world: int, master_addr: str, master_port: int,
                     timeout_s: float = 1800, listen: socket.socket | None = None):
    """The workers' process group (runtime/distributed.py `init_process_group`: nccl on GPU,
    gloo on CPU) and its one-dimensional device mesh: returns (device, mesh)."""
    device = init_process_group(rank, world, master_addr, master_port, timeout_s, listen)
    return device, init_device_mesh(device.type, (world,))


def shard(module: torch.nn.Module, layers_of: torch.nn.Module, mesh, compute: torch.dtype) -> torch.nn.Module:
    """fully_shard each decoder layer of `layers_of`, then `module` as the root. `compute`: the
    Layout's compute dtype (layout/); bf16 gets the mixed-precision policy (the gathered weights cast to bf16,
    gradients reduced in float32, on a GPU's nccl or a CPU's gloo alike)."""
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if compute == torch.bfloat16
          else MixedPrecisionPolicy())
    for layer in decoder_layers(layers_of):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(module, mesh=mesh, mp_policy=mp)
    return module


def replicate(module: torch.nn.Module, mesh, device: torch.device) -> torch.nn.Module:
    """DistributedDataParallel over the mesh's group: the wrapper to run the update's forward
    through (its backward averages the gradients in buckets, overlapped with the backward);
    `module` itself keeps its parameter names, for checkpoints and the weight sync."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    # Every rank loaded the same buffers (rotary tables) and none changes them: no sync per forward.
    args = inspect.signature(DistributedDataParallel).parameters
    no_sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in args else {"broadcast_buffers": False}
    return DistributedDataParallel(module, process_group=mesh.get_group(), **no_sync,
                                   device_ids=[device.index] if device.type == "cuda" else None)


def gather_full(params: list[torch.Tensor], dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """The full tensors of FSDP2-sharded parameters (dim-0 shards, as `fully_shard` makes them)
    with one all-gather per dtype instead of one per parameter (a collective: every rank calls it
    with the same parameters in the same order). Each rank packs its shards into one buffer, each
    parameter in a slot of its largest shard's size; rank r's shard of a parameter with d rows is
    torch.chunk's r-th piece (ceil(d / world) rows, fewer or none at the end). `dtype`: the
    floating-point shards are cast to it before the gather (the rollout engine's dtype: float32
    masters reach a bf16 engine in half the bytes, rounded as its loader would round them).
    Anything else (a plain tensor, another placement) goes through `full_tensor`, uncast."""
    from torch.distributed.tensor import DTensor, Shard

    out: list[torch.Tensor | None] = [None] * len(params)
    groups: dict[torch.dtype, list[int]] = {}
    for i, p in enumerate(params):
        flat = (isinstance(p, DTensor) and p.dim() > 0 and p.device_mesh.ndim == 1
                and tuple(p.placements) == (Shard(0),))
        if flat:
            groups.setdefault(_sent_as(p.dtype, dtype), []).append(i)
        else:
            out[i] = full_tensor(p)
    for sent, idx in groups.items():
        mesh = params[idx[0]].device_mesh
        world, group = mesh.size(), mesh.get_group()
        rows = [-(-params[i].shape[0] // world) for i in idx]  # the largest shard's rows
        per_row = [math.prod(params[i].shape[1:]) for i in idx]  # (indexing a DTensor is a collective)
        slots = [r * w for r, w in zip(rows, per_row)]
        local = params[idx[0]].to_local()
        buf = torch.zeros(sum(slots), dtype=sent, device=local.device)
        off = 0
        for i, slot in zip(idx, slots):
            shard = params[i].to_local().reshape(-1)
            buf[off:off + shard.numel()] = shard  # cast to the buffer's dtype as it is copied
            off += slot
        gathered = torch.empty(world * buf.numel(), dtype=sent, device=buf.device)
        dist.all_gather_into_tensor(gathered, buf, group=group)
        gathered = gathered.view(world, -1)
        if len(idx) == 1 and rows[0] * world == params[idx[0]].shape[0]:
            # one parameter in even shards: the gathered rows are the full tensor, no second copy
            out[idx[0]] = gathered.view(params[idx[0]].shape)
            continue
        off = 0
        for i, r, w, slot in zip(idx, rows, per_row, slots):
            shape, d = params[i].shape, params[i].shape[0]
            pieces = [gathered[k, off:off + max(0, min(r, d - k * r)) * w] for k in range(world)]
            out[i] = torch.cat(pieces).view(shape)
            off += slot
    return out


def _sent_as(own: torch.dtype, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a parameter of dtype `own` is gathered in: `dtype` for floating point, else its own."""
    return dtype if dtype is not None and own.is_floating_point else own


def iter_full(named: list[tuple[str, torch.Tensor]], bucket_bytes: int = SYNC_BUCKET_BYTES,
              dtype: torch.dtype | None = None):
    """(name, full tensor) for sharded parameters (gathered in `dtype`, see `gather_full`), a
    bucket of about `bucket_bytes` of full tensors at a time: one collective per bucket, and at
    most one bucket of full tensors alive beyond what the consumer keeps (a 7B model's sync never
    holds the whole model twice). A bucket closes once it reaches `bucket_bytes`; a parameter of
    `bucket_bytes` or more (a large vocabulary's embeddings or head) is gathered alone, where
    even shards need no second copy (`gather_full`): the bound plan.py `sync_bytes` counts. For
    the 50 parameters of benchmarks/vs_trl_task.py's model at 2 gloo ranks this is several times
    faster than one `full_tensor` each (benchmarks/RESULTS.md §9)."""
    bucket, size = [], 0
    for name, p in named:
        nbytes = p.numel() * _sent_as(p.dtype, dtype).itemsize
        if bucket and nbytes >= bucket_bytes:  # the large one alone
            yield from zip([n for n, _ in bucket], gather_full([t for _, t in bucket], dtype))
            bucket, size = [], 0
        bucket.append((name, p))
        size += nbytes
        if size >= bucket_bytes:
            yield from zip([n for n, _ in bucket], gather_full([t for _, t in bucket], dtype))
            bucket, size = [], 0
    if bucket:
        yield from zip([n for n, _ in bucket], gather_full([t for _, t in bucket], dtype))


def full_tensor(p: torch.Tensor) -> torch.Tensor:
    """All-gather a sharded parameter (a collective: every rank calls it in the same order)."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p
