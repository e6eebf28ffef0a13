"""The learning-rate schedule of the RL update: a linear warm-up, then constant, advanced once per
RL step (not per mini-batch), as verl's actor does (`get_constant_schedule_with_warmup` in
verl/utils/torch_functional.py, stepped once in fsdp_workers.py `update_actor`)."""

from __future__ import annotations

import torch


def warmup_factor(step: int, warmup: int) -> float:
    """The lr multiplier after `step` scheduler steps, i.e. of RL step `step + 1`: step / warmup
    while step < warmup, then 1. So RL step 1 runs at lr 0 (verl's choice, kept for parity: its
    gradients still move Adam's moments) and full lr starts at RL step warmup + 1."""
    return step / warmup if step < warmup else 1.0


def make_scheduler(opt: torch.optim.Optimizer, warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    # A plain lambda, not a callable object: LambdaLR's state_dict then leaves it out, and the
    # checkpoint (runtime/checkpoint/trusted.py save_rng) stores the step count as JSON.
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_factor(s, warmup))


def advance(sched: torch.optim.lr_scheduler.LRScheduler) -> float:
    """Step the schedule once the RL step's updates are done; returns the lr those updates used
    (the first group's: the LM's; a FlowRL Z-head group runs at a multiple of it). Read before
    stepping: afterwards the optimizer holds the next step's lr."""
    used = float(sched.optimizer.param_groups[0]["lr"])
    sched.step()
    return used
