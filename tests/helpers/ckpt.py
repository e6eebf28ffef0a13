"""Fake checkpoints for the checkpoint and run-directory tests: the files a real save writes
(DCP metadata and shards, per-rank RNG states, trainer_state.json with the file list, hf/), without
a model, a process group or Ray."""

import os
import random

import torch

from reasonrl_fast.runtime import checkpoint as ckpt
from reasonrl_fast.config import load_config


class Saver:
    """Stands in for the tokenizer and the HF config: finalize only calls save_pretrained."""

    def __init__(self, name):
        self.name = name

    def save_pretrained(self, d):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, self.name), "w") as f:
            f.write("{}")


def scheduler(lr=0.1):
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(1))], lr=lr)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def fake_checkpoint(out, step, run_id, world=2, keep=0):
    tmp = ckpt.tmp_path(str(out), step)
    for name in [".metadata"] + [f"__{r}_0.distcp" for r in range(world)]:
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(os.urandom(64))
    sched = scheduler()
    for r in range(world):
        ckpt.save_rng(tmp, r, sched)
    state = {"step": step, "run_id": run_id, "world_size": world, "sampler": {}, "python_rng": random.getstate()}
    return ckpt.finalize(tmp, state, Saver("tokenizer.json"), Saver("config.json"), keep)


def config(out, *overrides):
    return load_config(None, [f"trainer.output_dir={out}", *overrides])
