"""Run by test_optim.py under torchrun (2 CPU ranks, gloo) with torchao on PYTHONPATH, argv[1] a
checkpoint folder: FlowRL's actor (tiny Qwen2 + Z-head) in bf16 master weights, sharded by the
trainer's `shard` (vocabulary 61: uneven shards), with the optimizer `make_optimizer` gives for
optim.bf16_stochastic_round over the worker's two groups (the LM at optim.lr, the Z-head at
lr x flowrl.zhead_lr_mult) and the trainer's warm-up schedule. Three steps; a checkpoint as the
worker writes it (DCP of get_state_dict, the RNG and scheduler file); a fourth step; then a
fresh actor and optimizer load the checkpoint as the worker does and take the fourth step
again, which must give the same weights bit for bit. Prints OK and figures on rank 0."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from transformers import Qwen2Config, Qwen2ForCausalLM

from reasonrl_fast.config import load_config
from reasonrl_fast.runtime import checkpoint as ckpt
from reasonrl_fast.trainer.fsdp import full_tensor, shard
from reasonrl_fast.trainer.optim import make_optimizer
from reasonrl_fast.trainer.policy import Actor, make_batch
from reasonrl_fast.trainer.schedule import make_scheduler

path = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
seed = int(os.environ.get("SEED", "0"))
cfg = load_config(None, ["algo=flowrl", "model.dtype=bfloat16", "optim.bf16_stochastic_round=true",
                         "optim.lr=1e-6", "flowrl.zhead_lr_mult=10", "optim.warmup_steps=2"])


def build():
    torch.manual_seed(seed)  # the same init on every rank, and in both builds
    config = Qwen2Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    lm = Qwen2ForCausalLM(config).to(torch.bfloat16)
    actor = Actor(lm, zhead_layers=cfg.flowrl.zhead_layers)
    shard(actor, lm, mesh, torch.bfloat16)
    z = [p for n, p in actor.named_parameters() if n.startswith("proj_z.")]
    rest = [p for n, p in actor.named_parameters() if not n.startswith("proj_z.")]
    groups = [{"params": rest, "lr": cfg.optim.lr}, {"params": z, "lr": cfg.optim.lr * cfg.flowrl.zhead_lr_mult}]
    opt = make_optimizer(groups, cfg, torch.device("cpu"))
    return actor, opt, make_scheduler(opt, cfg.optim.warmup_steps)


g = torch.Generator().manual_seed(seed + rank)
prompts = [torch.randint(1, 61, (n,), generator=g).tolist() for n in (5, 3, 7)]
responses = [torch.randint(1, 61, (n,), generator=g).tolist() for n in (4, 6, 2)]
batch = make_batch(prompts, responses, 0, torch.device("cpu"))


def step(actor, opt, sched, k):
    torch.manual_seed(seed + 100 + k)  # the Z-head's dropout and the rounding's draws, per step
    lp, _, log_z = actor(batch, log_z=True)
    loss = (log_z - (lp * batch["response_mask"]).sum(-1)).square().mean()  # a TB-shaped loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()


def weights(actor):
    return {n: full_tensor(p.detach()).clone() for n, p in actor.named_parameters()}


actor, opt, sched = build()
assert type(opt).__module__.startswith("torchao."), type(opt)
before = weights(actor)
for k in range(3):
    step(actor, opt, sched, k)
saved = weights(actor)
assert {t.dtype for t in saved.values()} == {torch.bfloat16}
changed = sum(int((saved[n] != before[n]).sum()) for n in saved) / sum(t.numel() for t in saved.values())
lrs = [float(group["lr"]) for group in opt.param_groups]
model_sd, optim_sd = get_state_dict(actor, opt)
dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
ckpt.save_rng(path, rank, sched)  # the scheduler's state holds the tensor lrs: JSON all the same
if rank == 0:
    with open(os.path.join(path, ckpt.STATE), "w") as f:
        json.dump({"world_size": world}, f)
dist.barrier()
step(actor, opt, sched, 3)
continued = weights(actor)

actor2, opt2, sched2 = build()
model_sd, optim_sd = get_state_dict(actor2, opt2)
state = {"model": model_sd, "optim": optim_sd}
dcp.load(state, checkpoint_id=path)
set_state_dict(actor2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
ckpt.load_rng(path, rank, sched2)
loaded = weights(actor2)
assert all(torch.equal(loaded[n], saved[n]) for n in saved), "the loaded weights differ from the saved ones"
assert [float(group["lr"]) for group in opt2.param_groups] == lrs, (opt2.param_groups, lrs)
step(actor2, opt2, sched2, 3)
resumed = weights(actor2)
differ = [n for n in continued if not torch.equal(continued[n], resumed[n])]
assert not differ, f"the resumed step differs from the continued one in {differ}"
moved = [n for n in continued if not torch.equal(continued[n], saved[n])]
assert any(n.startswith("proj_z.") for n in moved) and any(n.startswith("lm.") for n in moved), moved
dist.barrier()  # every rank past its last collective before any tears the group down
if rank == 0:
    print(f"OK {len(saved)} parameters on {world} ranks; lrs {lrs}; changed {changed:.4f} in 3 steps; "
          f"resumed step identical", flush=True)
dist.destroy_process_group()
os._exit(0)  # as fsdp_gather_child.py: no interpreter teardown after the group is gone
