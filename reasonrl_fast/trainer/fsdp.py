"""FSDP2 helpers: process group, device mesh, and sharding one decoder layer at a time, then the
root (so the root holds embeddings, final norm, LM head and the Z-head)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from reasonrl_fast.trainer.model import decoder_layers


def init_distributed(rank: int, world: int, master_addr: str, master_port: int, timeout_s: float = 1800):
    """nccl on GPU, gloo on CPU; returns (device, mesh). A collective that waits longer than
    `timeout_s` for another rank (dead or stuck) fails instead of hanging."""
    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
                      RANK=str(rank), WORLD_SIZE=str(world))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return device, init_device_mesh(device.type, (world,))


def shard(module: torch.nn.Module, layers_of: torch.nn.Module, mesh, bf16: bool) -> torch.nn.Module:
    """fully_shard each decoder layer of `layers_of`, then `module` as the root. bf16 compute with
    fp32 gradient reduction when `bf16` (GPU)."""
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for layer in decoder_layers(layers_of):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(module, mesh=mesh, mp_policy=mp)
    return module


def full_tensor(p: torch.Tensor) -> torch.Tensor:
    """All-gather a sharded parameter (a collective: every rank calls it in the same order)."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p
