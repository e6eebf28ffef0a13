"""Run by test_fsdp.py under torchrun (2 CPU ranks, gloo, MALLOC_MMAP_THRESHOLD_ set so that a
freed buffer leaves the resident set at once): what trainer rank 0 holds beyond its shard while
it publishes an FSDP2-sharded model to a rollout worker (a subprocess, transport rank 1), a
bucket at a time, measured as the rise of its peak resident set (VmHWM, reset before each
publish) over its resident set before. Three ways: the publish's (fsdp.py `gather_rank_major`,
the gathered buffer broadcast as it is); the same holding a copy of each bucket (the control: a
second bucket the measurement must see); the full tensors cut out on the sender and packed again
(`iter_full` + transport.py `pack`, reported only: its peak depends on when the cut tensors
are freed). Prints one line of numbers on rank 0."""

import json
import math
import os
import subprocess
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from reasonrl_fast.rollout.transport import Transport, buckets, pack
from reasonrl_fast.runtime.distributed import rendezvous_socket
from reasonrl_fast.trainer.fsdp import gather_rank_major, iter_full, rank_major_world

MIB = 2**20
BUCKET = 32 * MIB
DTYPE = torch.bfloat16  # the engine's: float32 masters sent in half the bytes

RECEIVER = """
import sys, torch
from reasonrl_fast.rollout.transport import Transport
meta, world, bucket = eval(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = Transport("127.0.0.1", int(sys.argv[1]), 1, 2, 120)
for version, shards in ((1, world), (2, world), (3, 1)):
    for _ in t.receive(meta, version, torch.bfloat16, bucket, shards):
        pass
print("received", flush=True)
"""


def rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2047, bias=True) for _ in range(8)])  # uneven rows: padded slots
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
named = [(n, p.detach()) for n, p in model.named_parameters()]
params = [p for _, p in named]
meta = [(n, tuple(p.shape)) for n, p in named]
shards = rank_major_world(params)
assert shards == world, shards
idx_of = buckets(meta, DTYPE.itemsize, BUCKET)

sender = receiver = None
if rank == 0:
    listen = rendezvous_socket("127.0.0.1")
    port = listen.getsockname()[1]
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port), repr(meta), str(shards), str(BUCKET)])
    sender = Transport("127.0.0.1", port, 0, 2, 120, listen)


def publish(bufs, layout: int) -> int:
    """This rank's peak rise over its resident set while the weights go out."""
    dist.barrier()
    before = rss("VmRSS")
    reset_peak()
    if rank == 0:
        sender.send(bufs, meta, version, DTYPE, BUCKET, layout)
    else:
        for _ in bufs:
            pass
    return rss("VmHWM") - before


def holding_a_copy():
    """The publish's buffers, each with a copy of it held until the next: a second bucket that the
    measurement must see (the control)."""
    held = None
    for idx in idx_of:
        buf = gather_rank_major([params[i] for i in idx], DTYPE)
        held = buf.clone()
        yield buf
    del held


version = 1
rank_major = publish((gather_rank_major([params[i] for i in idx], DTYPE) for idx in idx_of), shards)
version = 2
control = publish(holding_a_copy(), shards)
version = 3
unpacked = publish(pack(iter_full(named, BUCKET, DTYPE), meta, DTYPE, BUCKET), 1)
dist.barrier()
if rank == 0:
    assert receiver.wait(timeout=120) == 0
    largest = max(sum(math.prod(meta[i][1]) for i in idx) * DTYPE.itemsize for idx in idx_of)
    print(json.dumps({"bucket_mib": largest / MIB, "rank_major_mib": rank_major / MIB, "control_mib": control / MIB,
                      "unpacked_mib": unpacked / MIB,
                      "shard_mib": sum(p.to_local().numel() * p.element_size() for p in params) / MIB}), flush=True)
dist.destroy_process_group()
os._exit(0)  # as fsdp_gather_child.py: no interpreter teardown under a gloo thread
