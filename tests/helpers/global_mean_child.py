"""Run by tests/trainer/test_global_mean.py under torchrun (2 CPU ranks, gloo). The ranks hold
deliberately unequal shares of one mini-batch (rank 0: one prompt with long responses, rank 1:
three prompts with short ones), run it as micro-batches of packed rows through DDP or FSDP2 in
float64 (FSDP2 with activation checkpointing), and rank 0 checks the summed gradient against the whole mini-batch in one process, in
one padded forward, for each loss aggregation; prints OK on rank 0."""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from reasonrl_fast.algos import get_algo  # noqa: E402
from reasonrl_fast.config import load_config  # noqa: E402
from reasonrl_fast.models.loading import enable_checkpointing  # noqa: E402
from reasonrl_fast.trainer import update  # noqa: E402
from reasonrl_fast.trainer.fsdp import full_tensor, replicate, shard  # noqa: E402
from reasonrl_fast.trainer.policy import Actor  # noqa: E402
from tests.layout.test_micro import CASES, _model, samples  # noqa: E402

mode = sys.argv[1]  # replicate | fsdp
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
seed = int(os.environ["SEED"])
n = 3
# every rank builds both shares: its own to train on, all of them for rank 0's reference
shares = [samples(seed, 1, n, 20, 40), samples(seed + 1, 3, n, 1, 6)]
adv = torch.randn(sum(len(s[1]) for s in shares), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
offset = [0, len(shares[0][1])]


def actor_for(cfg, algo):
    return Actor(_model(seed), 2 if algo.zhead else 0).double().eval()  # eval: no Z-head dropout


def run(cfg, algo, model, prompts, responses, rollout, adv, budget, packed, world):
    plans, totals = update.plan(prompts, responses, [slice(0, len(responses))], budget, packed,
                                algo.loss_units(cfg), world, "cpu")
    batches = [update.micro_batch(prompts, responses, rollout, idx, packed, 0, "cpu") for idx in plans[0]]
    ref = update.logprobs(model, [batches], cfg.rollout.temperature)[0] if algo.needs_ref(cfg) else None
    stats, _ = update.accumulate(model, algo, cfg, responses, plans[0], batches, adv, totals[0], world, None, ref)
    return plans[0], stats


checked = 0
for name, override in CASES:
    cfg = load_config(None, [f"algo={name}", override, f"rollout.n={n}"])
    algo = get_algo(cfg.algo)
    actor = actor_for(cfg, algo)
    if mode == "fsdp":  # with activation checkpointing, as the big configs run
        enable_checkpointing(actor.lm)
        actor.lm.train()  # transformers checkpoints in training mode only (no dropout in this model)
        shard(actor, actor.lm, mesh, torch.float32)
        model = actor
    else:
        model = replicate(actor, mesh, torch.device("cpu"))
    prompts, responses, rollout = shares[rank]
    mine = adv[offset[rank]:offset[rank] + len(responses)]
    plan, stats = run(cfg, algo, model, prompts, responses, rollout, mine, 64, True, world)
    got = {k: full_tensor(p.grad) for k, p in actor.named_parameters() if p.grad is not None}
    counts = [None] * world
    dist.all_gather_object(counts, len(plan))
    assert len(set(counts)) == 1, counts  # every rank ran as many forwards
    losses = [None] * world
    dist.all_gather_object(losses, stats["train/loss"])
    if rank == 0:
        assert counts[0] > 1  # rank 1's short sequences alone would fit one forward
        ref_actor = actor_for(cfg, algo)
        every = [sum((s[i] for s in shares), []) for i in range(3)]
        _, ref_stats = run(cfg, algo, ref_actor, *every, adv, 0, False, 1)
        want = {k: p.grad for k, p in ref_actor.named_parameters() if p.grad is not None}
        assert got.keys() == want.keys()
        for k in want:
            scale = want[k].abs().max().clamp(min=1.0)
            assert (got[k] - want[k]).abs().max() / scale < 1e-10, (name, override, k)
        # the driver's mean of the workers' losses is the mini-batch's loss
        assert abs(sum(losses) / world - ref_stats["train/loss"]) <= 1e-10 * max(1.0, abs(ref_stats["train/loss"])), (losses, ref_stats)
        checked += 1
dist.barrier()
if rank == 0:
    print(f"OK {checked} losses over {world} unequal ranks ({mode})", flush=True)
# joins gloo's threads before the interpreter exits: left to the exit, a rank can abort in a
# thread's destructor ("terminate called without an active exception") after its work is done
del model, actor
dist.destroy_process_group()
# and skips the interpreter's teardown, where FSDP state still holding the group could do the
# same (seen once after both ranks had passed every check), as fsdp_gather_child.py does
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
