"""Helpers for the end-to-end trainer tests: run `python -m reasonrl_fast.train` in a subprocess
with a tiny configuration (tiny model, two CPU workers, a few steps). The `train` and
`trained_run` fixtures (tests/conftest.py) hand these to a test and put it in the `e2e` tier."""

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from reasonrl_fast.util import read_metrics  # noqa: F401  (the e2e tests take it from here)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2", "model.num_heads=2",
    "sft.steps=5", "sft.batch_size=8", "data.digits=2", "data.prompts_per_step=4",
    "optim.mini_batch_prompts=4", "rollout.n=2", "rollout.max_new_tokens=12", "data.val_size=8",
    "trainer.workers_per_node=2", "trainer.progress=false", "trainer.val_every=2",
]


def repo_env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout first on PYTHONPATH (so `tests.helpers.*`
    reward functions import in the trainer's processes), plus `extra`."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), **extra}


def sft_cache(tmp_path) -> str:
    """The warm starts' cache every test of this pytest run shares, both xdist workers' alike
    (`tmp_path`: a test's): one warm start per config, not one per worker. sft.py writes each
    entry under a temporary name and renames it, so two workers building the same one is safe."""
    base = tmp_path.parent  # the session's base directory (under xdist, one per worker: popen-gwN)
    if base.name.startswith("popen-gw"):
        base = base.parent
    return str(base / "sft_cache")


def comparable(row: dict) -> dict:
    """A metrics row without what a repeated run measures differently (times, throughput, memory,
    reward latency): what a resumed run must log exactly as an uninterrupted one."""
    return {k: v for k, v in row.items() if not k.startswith(("time/", "perf/", "memory/", "reward/latency"))}


def run_train(args, tmp_path, timeout=300, env_extra=None, check=True, python=None, tiny=True):
    """`python -m reasonrl_fast.train` with TINY settings (`tiny=False`: the embedded default's;
    `python`: another interpreter, e.g. the vLLM venv's, running this checkout)."""
    env = repo_env(**(env_extra or {}))
    cmd = [str(python or sys.executable), "-m", "reasonrl_fast.train", *(TINY if tiny else ["trainer.progress=false"]),
           f"sft.cache_dir={sft_cache(tmp_path)}", *args]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"train failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return p


def popen_train(args, tmp_path, python=None, tiny=True, **env) -> subprocess.Popen:
    """`run_train`'s command started, not waited for (its stdout and stderr piped): for the tests
    that interrupt or watch a run."""
    cmd = [str(python or sys.executable), "-m", "reasonrl_fast.train", *(TINY if tiny else []),
           f"sft.cache_dir={sft_cache(tmp_path)}", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=repo_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


# The shared run: one trained tiny run for every test that needs *a* trained run rather than a
# particular one (the smoke checks of a FlowRL run, the merge round trip, eval end to end). FlowRL,
# so the checkpoint holds a Z-head; FSDP2 shards, so merge reassembles them; a wider model and a
# longer warm start than TINY's (5 steps: accuracy 0), and room for the whole answer (TINY's 12
# tokens cut it off), so that validation accuracy is far from 0 and 1 (about 0.45) and eval's
# agreement with it means something: 128 validation prompts x 4 samples, se@4 about 0.03.
SHARED_VAL, SHARED_VAL_N = 128, 4
SHARED = ["algo=flowrl", "trainer.sharding=fsdp", "trainer.steps=2", "trainer.save_every=2",
          "trainer.save_last=true", "trainer.val_every=2", f"data.val_size={SHARED_VAL}",
          f"rollout.val_n={SHARED_VAL_N}", "rollout.val_temperature=1.0", "rollout.max_new_tokens=32",
          "model.hidden_size=64", "model.intermediate_size=128", "sft.steps=600", "sft.batch_size=32"]


@dataclass(frozen=True)
class TrainedRun:
    dir: Path     # the run directory: metrics.jsonl, config.yaml, tensorboard/, checkpoint-2/
    stdout: str   # made by TINY + SHARED

    @property
    def checkpoint(self) -> Path:
        return self.dir / "checkpoint-2"


def shared_run(base: Path) -> TrainedRun:
    out = base / "shared_run"
    p = run_train([*SHARED, f"trainer.output_dir={out}"], out, timeout=600)
    return TrainedRun(out, p.stdout)
