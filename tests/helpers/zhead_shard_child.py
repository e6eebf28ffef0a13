"""Run by test_fsdp.py under torchrun (2 CPU ranks, gloo): an `Actor` with a Z-head over a tiny
Qwen2 model whose master weights are `model dtype` (argv[1]), sharded by the trainer's `shard`
with the mixed-precision policy a GPU run uses (bf16 compute, fp32 gradient reduction); two
optimizer steps must give finite log-probs and log Z and change every parameter the loss
reaches, the Z-head's included. Prints OK on rank 0."""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import Qwen2Config, Qwen2ForCausalLM

from reasonrl_fast.trainer.fsdp import full_tensor, shard
from reasonrl_fast.trainer.policy import Actor, make_batch

dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[sys.argv[1]]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(int(os.environ.get("SEED", "0")))  # the same init on every rank
config = Qwen2Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
lm = Qwen2ForCausalLM(config).to(dtype)
actor = Actor(lm, zhead_layers=2)
assert {p.dtype for p in actor.parameters()} == {dtype}, {n: p.dtype for n, p in actor.named_parameters()}
shard(actor, lm, mesh, torch.bfloat16)
before = {n: full_tensor(p.detach()).clone() for n, p in actor.named_parameters()}
# a learning rate every dtype resolves: this checks the sharded path, not rounding
opt = torch.optim.AdamW(actor.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(rank)
prompts = [torch.randint(1, 61, (n,), generator=g).tolist() for n in (5, 3, 7)]
responses = [torch.randint(1, 61, (n,), generator=g).tolist() for n in (4, 6, 2)]
batch = make_batch(prompts, responses, 0, torch.device("cpu"))
for _ in range(2):
    lp, _, log_z = actor(batch, log_z=True)
    assert lp.shape == batch["targets"].shape and log_z.shape == (3,), (lp.shape, log_z.shape)
    assert torch.isfinite(lp).all() and torch.isfinite(log_z).all()
    loss = (log_z - (lp * batch["response_mask"]).sum(-1)).square().mean()  # a TB-shaped loss
    loss.backward()
    opt.step()
    opt.zero_grad()
after = {n: full_tensor(p.detach()) for n, p in actor.named_parameters()}
assert all(after[n].dtype == dtype for n in after), {n: t.dtype for n, t in after.items()}
unchanged = [n for n in before if torch.equal(before[n], after[n])]
assert not unchanged, unchanged
assert any(n.startswith("proj_z.") for n in before)
dist.barrier()  # every rank past its last collective before any tears the group down
if rank == 0:
    print(f"OK {len(before)} parameters in {sys.argv[1]} on {world} ranks", flush=True)
dist.destroy_process_group()
os._exit(0)  # as fsdp_gather_child.py: no interpreter teardown after the group is gone
