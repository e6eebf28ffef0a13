"""End-to-end: a few steps of each algorithm on the tiny model, CPU, two Ray workers, sharded with
FSDP2 or replicated (DDP, the CPU default); resume equivalence in both and across them; a reward
function that raises; two Ray nodes. The FlowRL smoke checks read the session's shared run."""

import os
import shutil

import pytest
import torch

from tests.helpers.metric_names import documented, problems
from tests.helpers.train import comparable, read_metrics

REQUIRED = ["step", "reward/mean", "accuracy/mean", "response_length/mean", "entropy/mean", "train/grad_norm",
            "time/rollout_s", "time/update_s", "time/step_s", "perf/tokens_per_s", "memory/peak_gb"]
FLOWRL = ["log_z/mean", "tb/delta_abs_mean", "tb/is_weight_mean"]


def test_flowrl_smoke(trained_run):
    out = trained_run.dir
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        for k in REQUIRED + FLOWRL:
            assert k in r, k
    assert "val/accuracy" in rows[0] and "val/accuracy" in rows[2]
    assert problems(set().union(*rows), documented()) == []  # docs/trainer.md §Metrics
    assert (out / "config.yaml").exists() and any((out / "tensorboard").iterdir())
    assert (out / "checkpoint-2" / "trainer_state.json").exists()
    assert "data parallel: fsdp" in trained_run.stdout


def test_grpo_smoke_kl_uneven_minibatches_flaky_reward(train, tmp_path):
    """5 prompts over 2 workers (shares of 3 and 2) in 2 mini-batches of unequal size: each worker
    trains on the samples it kept, sent only their advantages. Sharded by FSDP2, each mini-batch
    in micro-batches of packed rows, with activation checkpointing, as the large configs run."""
    out = tmp_path / "run"
    p = train(["algo=grpo", "trainer.steps=2", f"trainer.output_dir={out}", "grpo.kl_coef=0.1",
               "data.prompts_per_step=5", "optim.mini_batch_prompts=3", "grpo.overlong_buffer=4",
               "data.reward_fn=tests.helpers.faulty_rewards:raises_every_third", "trainer.sharding=fsdp",
               "optim.micro_batch_tokens=48", "model.gradient_checkpointing=true"], tmp_path)
    assert "packing: on" in p.stdout and "at most 48 tokens per forward; activation checkpointing on" in p.stdout
    # the console holds the run's own lines: no worker's progress bars, no Ray note on folded lines
    console = p.stdout + p.stderr
    assert "Loading weights" not in console and "Ray deduplicates logs" not in console, console[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        for k in REQUIRED + ["kl/mean", "grpo/clip_frac"]:
            assert k in r, k
        assert not any(k.startswith("tb/") for k in r)
        assert r["train/micro_batches"] > 2  # 2 mini-batches of 4 or 6 sequences up to 28 tokens
    assert sum(r["reward/errors"] for r in rows[1:]) > 0  # the raising samples were counted


@pytest.mark.parametrize("sharding", ["replicate", "fsdp"])
def test_resume_equivalence(train, tmp_path, sharding):
    """A run SIGKILLed in the middle of step 3 (after checkpoint-2) and resumed with resume=auto
    logs exactly the metrics of an uninterrupted run."""
    args = ["algo=flowrl", "trainer.steps=4", "trainer.save_every=2", "trainer.keep_checkpoints=0",
            f"trainer.sharding={sharding}",
            "trainer.val_every=0", "data.reward_fn=tests.helpers.faulty_rewards:kills_the_driver",
            "reward.num_workers=1"]  # one worker counts every call of the step
    full = tmp_path / "full"
    train(args + [f"trainer.output_dir={full}"], tmp_path)
    ref = read_metrics(full)
    assert [r["step"] for r in ref] == [1, 2, 3, 4]

    killed = tmp_path / "killed"
    per_step = 4 * 2  # data.prompts_per_step x rollout.n in the tiny config: reward calls per step
    p = train(args + [f"trainer.output_dir={killed}"], tmp_path, check=False,
                  env_extra={"REASONRL_KILL_AT_CALL": str(2 * per_step + 1)})
    assert p.returncode == -9, (p.returncode, p.stderr[-2000:])  # killed during step 3's rewards
    assert (killed / "checkpoint-2").is_dir() and not (killed / "checkpoint-4").exists()
    assert [r["step"] for r in read_metrics(killed)] == [1, 2]
    # a half-written later checkpoint must be ignored by resume=auto
    shutil.copytree(full / "checkpoint-4", killed / "checkpoint-4.tmp")

    p = train(args + [f"trainer.output_dir={killed}", "trainer.resume=auto"], tmp_path)
    assert "checkpoint-2 (step 2)" in p.stdout  # it resumed (a restart from 0 would match too)
    got = read_metrics(killed)
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for a, b in zip(ref, got):
        assert comparable(a) == comparable(b), (a["step"], comparable(a), comparable(b))


@pytest.mark.proc
def test_bad_config_exits_with_key(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "reasonrl_fast.train", "trainer.stepz=3"], capture_output=True,
                       text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert p.returncode != 0 and "trainer.stepz" in p.stderr


@pytest.mark.skipif(os.environ.get("REASONRL_MULTINODE", "1") == "0", reason="REASONRL_MULTINODE=0")
def test_two_node_ray_cluster(train, tmp_path):
    """Two Ray nodes on one machine (one CPU each), workers placed one per node; beside them a run
    without an address on a local instance of its own."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        out = tmp_path / "run"
        train(["algo=flowrl", "trainer.steps=1", f"trainer.output_dir={out}", "trainer.nnodes=2",
                   "trainer.workers_per_node=1", f"trainer.ray_address={cluster.address}", "trainer.val_every=0"],
                  tmp_path, env_extra={"RAY_ADDRESS": ""})
        assert [r["step"] for r in read_metrics(out)] == [1]
        # a run given no address starts its own instance, never this one, whose address Ray left
        # where ray.init() without an address would find it (/tmp/ray/ray_current_cluster)
        own = tmp_path / "own"
        train(["trainer.steps=1", f"trainer.output_dir={own}", "trainer.val_every=0"], tmp_path,
              env_extra={"RAY_ADDRESS": ""})
        assert [r["step"] for r in read_metrics(own)] == [1]
    finally:
        cluster.shutdown()


def test_resume_across_sharding(train, tmp_path):
    """A checkpoint written by FSDP2 shards resumes replicated (DCP reshards on load), and the
    merged weights of both runs' first checkpoint agree."""
    out = tmp_path / "run"
    base = ["algo=flowrl", "trainer.val_every=0", "trainer.save_every=2", "trainer.keep_checkpoints=0",
            f"trainer.output_dir={out}"]
    train(base + ["trainer.steps=2", "trainer.sharding=fsdp"], tmp_path)
    p = train(base + ["trainer.steps=3", "trainer.sharding=replicate", "trainer.save_last=true"], tmp_path)
    assert "checkpoint-2 (step 2)" in p.stdout and "data parallel: replicate" in p.stdout
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]

    from reasonrl_fast.runtime.merge import load_model_tensors

    a, b = load_model_tensors(str(out / "checkpoint-2")), load_model_tensors(str(out / "checkpoint-3"))
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)  # step 3 trained


def test_partition_task_logs_and_evaluates_diversity(train, tmp_path):
    """The embedded task with many right answers, end to end: validation with 2 samples per prompt
    logs pass@2, distinct@2 and entropy@2, and eval of the last checkpoint reports distinct@n."""
    import json
    import subprocess
    import sys

    from tests.helpers.train import ROOT, repo_env

    out = tmp_path / "run"
    task = ["data.task=partition", "rollout.max_new_tokens=29", "data.val_size=8"]
    train(["algo=flowrl", "trainer.steps=2", f"trainer.output_dir={out}", "trainer.save_last=true",
           "rollout.val_n=2", *task], tmp_path)
    rows = read_metrics(out)
    for r in (rows[0], rows[-1]):
        assert 0 <= r["val/distinct@2"] <= 2 and 0 <= r["val/pass@2"] <= 1 and r["val/entropy@2"] >= 0, r
    p = subprocess.run([sys.executable, "-m", "reasonrl_fast.eval", f"model.path={out / 'checkpoint-2'}", *task,
                        "eval.n=4", f"eval.output_dir={tmp_path / 'eval'}", "trainer.workers_per_node=1"],
                       cwd=ROOT, env=repo_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    part = summary["per_source"]["partition"]
    assert part["prompts"] == 8 and 0 <= part["distinct@4"] <= 4 and part["maj@4"] is None
    assert "distinct@4" in p.stdout and "entropy@4" in p.stdout
