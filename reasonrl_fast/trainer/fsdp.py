"""Data-parallel helpers: process group, device mesh, FSDP2 sharding one decoder layer at a time,
then the root (so the root holds embeddings, final norm, LM head and the Z-head), or replication
(DDP) where sharding costs more than it saves (`trainer.sharding`), and the weight sync's gathers."""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from reasonrl_fast.layout import SYNC_BUCKET_BYTES
from reasonrl_fast.models.loading import decoder_layers
from reasonrl_fast.runtime import shards
from reasonrl_fast.runtime.distributed import init_process_group


def init_distributed(rank: int, world: int, master_addr: str, master_port: int,
                     timeout_s: float = 1800, listen: socket.socket | None = None):
    """The workers' process group (runtime/distributed.py `init_process_group`: nccl on GPU,
    gloo on CPU) and its one-dimensional device mesh: returns (device, mesh)."""
    device = init_process_group(rank, world, master_addr, master_port, timeout_s, listen)
    return device, init_device_mesh(device.type, (world,))


def shard(module: torch.nn.Module, layers_of: torch.nn.Module, mesh, compute: torch.dtype,
          offload: bool = False) -> torch.nn.Module:
    """fully_shard each decoder layer of `layers_of`, then `module` as the root. `compute`: the
    Layout's compute dtype (layout/); bf16 gets the mixed-precision policy (the gathered weights cast to bf16,
    gradients reduced in float32, on a GPU's nccl or a CPU's gloo alike). `offload` (the Layout's):
    FSDP2's CPU offload policy, the shards in host memory (pinned where a GPU copies them), copied
    to the device a unit at a time for its gathers, the gradients copied back."""
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if compute == torch.bfloat16
          else MixedPrecisionPolicy())
    extra = {"offload_policy": CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda")} if offload else {}
    for layer in decoder_layers(layers_of):
        fully_shard(layer, mesh=mesh, mp_policy=mp, **extra)
    fully_shard(module, mesh=mesh, mp_policy=mp, **extra)
    return module


def clip_grad_norm(params: list[torch.Tensor], max_norm: float, device: torch.device) -> torch.Tensor:
    """`clip_grad_norm_` of `params` whose gradients may sit in host memory (trainer.offload): their
    norm (a DTensor reduced over the mesh where they are sharded) is moved to the mesh's `device`
    before it is reduced, as nccl reduces device tensors only, and the clip applies it where the
    gradients are. Returns the total norm, a plain tensor on `device` (the same decision on every
    rank: it is global)."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    norm = full_tensor(norm.to(device))
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm.to(grads[0].device) if grads else norm, foreach=True)
    return norm


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


def _flat(p: torch.Tensor) -> bool:
    """Whether `p` is a dim-0 shard of a one-dimensional mesh, as `fully_shard` makes them."""
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(p, DTensor) and p.dim() > 0 and p.device_mesh.ndim == 1 and tuple(p.placements) == (Shard(0),)


def rank_major_world(params: list[torch.Tensor]) -> int:
    """The shards of the rank-major layout `gather_rank_major` gives `params` in (runtime/shards.py):
    its mesh's size where every one is a dim-0 shard of one mesh (FSDP2), else 1 (full tensors: a
    replica's, DDP's)."""
    if params and all(_flat(p) for p in params) and len({id(p.device_mesh) for p in params}) == 1:
        return params[0].device_mesh.size()
    return 1


def gather_rank_major(params: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """One buffer of `dtype` that holds the full tensors of `params` in the rank-major layout of
    `rank_major_world(params)` shards (a collective where that is above 1: every rank calls it with
    the same parameters in the same order). Each rank packs its shards into its own row of the
    output and the rows are gathered in place, so the bucket is held once. With one shard the
    full tensors are copied in back to back, cast as they are copied."""
    world = rank_major_world(params)
    shapes = [tuple(p.shape) for p in params]
    sizes = shards.slots(shapes, world)  # (a DTensor's shape is its full shape: no collective)
    device = _collective_device(params[0], world) if params else None
    out = torch.zeros(world * sum(sizes), dtype=dtype, device=device)
    if world == 1:
        off = 0
        for p, size in zip(params, sizes):
            out[off:off + size] = full_tensor(p).reshape(-1)
            off += size
        return out
    mesh = params[0].device_mesh
    group, rows = mesh.get_group(), out.view(world, -1)
    mine = rows[mesh.get_local_rank()]
    off = 0
    for p, size in zip(params, sizes):
        shard = p.to_local().reshape(-1)
        mine[off:off + shard.numel()] = shard  # cast to the buffer's dtype as it is copied
        off += size
    if dist.get_backend(group) == "gloo":
        # gloo's all-gather stages its output in a buffer of its own: rank 0 held 2 to 2.5
        # buckets through it, against 1 for a broadcast of each rank's row in place, which was
        # no slower (benchmarks/RESULTS.md §21)
        for k in range(world):
            dist.broadcast(rows[k], src=dist.get_global_rank(group, k), group=group)
    else:  # nccl gathers in place
        dist.all_gather_into_tensor(out, mine, group=group)
    return out


def gather_full(params: list[torch.Tensor], dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """The full tensors of FSDP2-sharded parameters (dim-0 shards, as `fully_shard` makes them)
    with one gather per dtype instead of one per parameter (a collective: every rank calls it
    with the same parameters in the same order), cut out of the rank-major buffer of
    `gather_rank_major` (runtime/shards.py: a lone parameter in even shards is a view of it, no
    second copy). `dtype`: the floating-point shards are cast to it before the gather (the rollout
    engine's dtype: float32 masters reach a bf16 engine in half the bytes, rounded as its loader
    would round them). Anything else (a plain tensor, another placement) goes through
    `full_tensor`, uncast."""
    out: list[torch.Tensor | None] = [None] * len(params)
    groups: dict[torch.dtype, list[int]] = {}
    for i, p in enumerate(params):
        if _flat(p):
            groups.setdefault(_sent_as(p.dtype, dtype), []).append(i)
        else:
            out[i] = full_tensor(p)
    for sent, idx in groups.items():
        group = [params[i] for i in idx]
        buf = gather_rank_major(group, sent)
        for i, t in zip(idx, shards.unpack(buf, [tuple(p.shape) for p in group], rank_major_world(group))):
            out[i] = t
    return out


def _collective_device(p: torch.Tensor, world: int) -> torch.device:
    """Where a gather of `p` runs: its mesh's device (offloaded shards sit in host memory, and nccl
    gathers device tensors only), else where `p` is."""
    local = p.to_local() if hasattr(p, "to_local") else p
    if world > 1 and p.device_mesh.device_type == "cuda" and local.device.type != "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return local.device


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
