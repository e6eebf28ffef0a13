"""Run by test_fsdp.py under torchrun (2 or 4 CPU ranks, gloo): gather_full (and iter_full,
whatever its bucket size, and in another dtype cast) must equal full_tensor, parameter by parameter, on shapes whose rows do not split evenly (fewer rows than
ranks included), for mixed dtypes; prints OK on rank 0."""

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from reasonrl_fast.trainer.fsdp import full_tensor, gather_full, iter_full

dist.init_process_group("gloo")
world = dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(int(os.environ.get("SEED", "0")))  # the same init on every rank
model = torch.nn.Sequential(
    torch.nn.Embedding(3, 4),          # 3 rows: uneven on 2 ranks, one empty shard on 4
    torch.nn.Linear(4, 7),             # weight 7 x 4, bias 7
    torch.nn.Linear(7, 1, bias=False),  # one row: empty shards
    torch.nn.LayerNorm(1),
    torch.nn.Linear(1, 8),             # 8 rows: even shards, gathered alone without a copy
)
model[1].to(torch.float64)
model[1].weight.data.normal_()  # not just the init's range
for m in (model[0], model[1], model[4]):
    fully_shard(m, mesh=mesh)
fully_shard(model, mesh=mesh)
params = [p.detach() for p in model.parameters()]
got = gather_full(params)
want = [full_tensor(p) for p in params]
for (name, _), g, w in zip(model.named_parameters(), got, want):
    assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, w.dtype, g.shape, w.shape)
    assert torch.equal(g, w), name
named = list(zip([n for n, _ in model.named_parameters()], params))
for bucket_bytes in (1, 100, 2**30):  # a bucket per parameter, a few per bucket, one bucket
    got = list(iter_full(named, bucket_bytes))
    assert [n for n, _ in got] == [n for n, _ in named]
    assert all(torch.equal(g, w) for (_, g), w in zip(got, want))
# gathered in another dtype (the engine's): the full tensors cast, bit for bit, the floats only
for dtype in (torch.bfloat16, torch.float64):
    for bucket_bytes in (1, 2**30):
        got = list(iter_full(named, bucket_bytes, dtype))
        for (name, g), w in zip(got, want):
            assert g.dtype == dtype and torch.equal(g, w.to(dtype)), (name, g.dtype)
dist.barrier()  # every rank past its last collective before any tears the group down
if dist.get_rank() == 0:
    print(f"OK {len(params)} parameters on {world} ranks", flush=True)
dist.destroy_process_group()
# Skip the interpreter's teardown: once, after every check had passed, a gloo thread still
# joinable there aborted rank 0 ("terminate called without an active exception", SIGABRT).
os._exit(0)
