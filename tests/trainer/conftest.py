"""Helpers for the end-to-end trainer tests: run `python -m reasonrl_fast.train` in a subprocess
with a tiny configuration (tiny model, two CPU workers, a few steps)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2", "model.num_heads=2",
    "sft.steps=5", "sft.batch_size=8", "data.digits=2", "data.prompts_per_step=4",
    "optim.mini_batch_prompts=4", "rollout.n=2", "rollout.max_new_tokens=12", "data.val_size=8",
    "trainer.workers_per_node=2", "trainer.progress=false", "trainer.val_every=2",
]


def run_train(args, tmp_path, timeout=300, env_extra=None, check=True):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "tests", "trainer"), env.get("PYTHONPATH", "")])
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "reasonrl_fast.train", *TINY, f"sft.cache_dir={tmp_path.parent / 'sft_cache'}", *args]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"train failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return p


def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture
def train():
    return run_train
