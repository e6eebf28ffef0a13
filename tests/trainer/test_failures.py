"""Failures that used to pass silently or hang: non-finite rewards (the step was thrown away on
every rank), a dead worker (the driver waited for the collective timeout); and bad input found
late, which ends the run as one line and exit 2: more nodes than a local instance has (before
Ray starts), a model a worker cannot load or pack (raised in the worker)."""

import glob
import math
import os
import re
import time

import pytest

from tests.helpers.train import read_metrics
from tests.helpers.model_dirs import model_dir
from reasonrl_fast.trainer.loop import finite_rewards


def test_finite_rewards():
    got, n = finite_rewards([1.0, float("nan"), 0.5, float("inf"), float("-inf"), 0.0])
    assert got == [1.0, 0.0, 0.5, 0.0, 0.0, 0.0] and n == 3


def test_nan_rewards_train_and_the_run_dir_is_guarded(train, tmp_path):
    """One real run shared by several checks: NaN/inf rewards are counted and the steps still
    train; the checkpoint holds no pickle; keep_checkpoints prunes the run's own checkpoints;
    a fresh run on that directory is refused before anything slow starts."""
    out = tmp_path / "run"
    train(["trainer.steps=2", f"trainer.output_dir={out}", "trainer.val_every=0", "trainer.save_every=1",
               "trainer.keep_checkpoints=1", "data.reward_fn=tests.helpers.faulty_rewards:nan_or_inf"], tmp_path)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["reward/nonfinite"] > 0 and r["train/skipped_updates"] == 0
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"]) and math.isfinite(r["reward/mean"])

    ck = out / "checkpoint-2"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]  # keep_checkpoints=1
    assert sorted(os.path.basename(p) for p in glob.glob(str(ck / "rng_rank*"))) == [
        "rng_rank0.safetensors", "rng_rank1.safetensors"]
    assert not glob.glob(str(ck / "**" / "*.pt"), recursive=True)

    t = time.time()
    p = train(["trainer.steps=2", f"trainer.output_dir={out}", "trainer.resume=never"], tmp_path, check=False)
    assert p.returncode != 0 and "holds checkpoints of an earlier run (checkpoint-2)" in p.stderr, p.stderr[-2000:]
    assert "trainer.overwrite=true" in p.stderr and ck.is_dir() and len(read_metrics(out)) == 2
    assert time.time() - t < 60  # refused before Ray or the warm start


def test_dead_worker_is_named_at_once(ray_local):
    from reasonrl_fast.runtime.ray_cluster import WorkerError, gather

    class Rank:  # defined here so that Ray ships it by value (the test module is not importable there)
        def work(self, die: bool) -> int:
            if die:
                time.sleep(1)
                os._exit(1)
            time.sleep(120)  # a rank blocked in a collective with the dead one
            return 0

    actors = [ray_local.remote(num_cpus=0)(Rank).remote() for _ in range(2)]
    t = time.time()
    with pytest.raises(WorkerError, match="worker rank 1 died during train_step"):
        gather([a.work.remote(i == 1) for i, a in enumerate(actors)], "train_step")
    assert time.time() - t < 60


def collective_rank():
    """A rank of a collective: one that dies mid-call, one whose collective fails as a dead
    peer's does ("Connection reset by peer"), one that waits in it, one that returns. Made in a
    function so that Ray ships the class by value (the test module is not importable there)."""

    class Rank:
        def work(self, fate: str) -> int:
            if fate == "dies":
                time.sleep(2)
                os._exit(1)
            if fate == "fails":
                time.sleep(0.5)
                raise RuntimeError("Read error [127.0.0.1]:34689: Connection reset by peer")
            if fate == "waits":
                time.sleep(120)
            return 0

    return Rank


def test_a_rank_that_died_is_named_where_a_live_rank_failed_first(ray_local, monkeypatch):
    """A peer's death fails a collective on the live ranks too, often before Ray reports the
    death: the run names the rank that died. A failure with no death behind it is named as
    itself once the grace (shortened here) is over."""
    from reasonrl_fast.runtime import ray_cluster
    from reasonrl_fast.runtime.ray_cluster import WorkerError, gather

    actors = [ray_local.remote(num_cpus=0)(collective_rank()).remote() for _ in range(2)]
    with pytest.raises(WorkerError, match="worker rank 1 died during train_step") as e:
        gather([a.work.remote(f) for a, f in zip(actors, ("fails", "dies"))], "train_step")
    assert "Connection reset by peer" in repr(e.value.__cause__)  # the live rank's failure, chained
    monkeypatch.setattr(ray_cluster, "PEER_DEATH_GRACE_S", 1.0)
    actors = [ray_local.remote(num_cpus=0)(collective_rank()).remote() for _ in range(2)]
    t = time.time()
    with pytest.raises(WorkerError, match="worker rank 0 failed during train_step: RuntimeError"):
        gather([a.work.remote(f) for a, f in zip(actors, ("fails", "waits"))], "train_step")
    assert time.time() - t < 30


def test_a_setting_a_worker_refuses_reaches_the_driver_as_the_user_error(ray_local):
    from reasonrl_fast.errors import ConfigError
    from reasonrl_fast.runtime.ray_cluster import gather

    class Rank:  # a worker that finds a setting wrong only once it knows its device (compute_dtype)
        def setup(self, refuse: bool) -> int:
            if refuse:
                raise ConfigError("model.compute_dtype=bfloat16 over torch.float32 master weights needs FSDP2")
            return 0

    actors = [ray_local.remote(num_cpus=0)(Rank).remote() for _ in range(2)]
    with pytest.raises(ConfigError, match=r"^model\.compute_dtype=bfloat16 over torch\.float32 master weights"):
        gather([a.setup.remote(i == 1) for i, a in enumerate(actors)], "setup")


def test_worker_killed_mid_run_ends_the_run_naming_its_rank(train, tmp_path):
    out = tmp_path / "run"
    t = time.time()
    p = train(["trainer.steps=3", f"trainer.output_dir={out}", "trainer.val_every=0",
                   "data.reward_fn=tests.helpers.faulty_rewards:kills_a_worker"], tmp_path, check=False, timeout=240)
    assert "killing worker process" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    # The first share is scored while the other worker may still generate: the dead rank is
    # named during whichever call was waiting on it.
    assert p.returncode != 0 and re.search(r"worker rank [01] died during (generate|train_step)", p.stderr), \
        p.stderr[-3000:]
    assert time.time() - t < 200  # not the collective timeout


def test_more_nodes_than_a_local_instance_is_refused_before_ray_starts(monkeypatch, tmp_path, capsys):
    import ray

    from reasonrl_fast import train

    def no_ray(*args, **kwargs):
        raise AssertionError("ray.init was called")

    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    path = model_dir(tmp_path / "model", "qwen2")
    out = tmp_path / "run"
    capsys.readouterr()  # save_pretrained's progress bar
    with pytest.raises(SystemExit) as e:
        train.main([f"model.path={path}", "trainer.nnodes=3", f"trainer.output_dir={out}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: trainer.nnodes=3, but without trainer.ray_address"), err
    assert "one node" in err and not out.exists()  # before the run directory, the warm start and Ray


def test_a_model_a_worker_refuses_ends_the_run_in_one_line(ray_local, tmp_path, capsys):
    """Raised in the worker's setup (the preflight refuses both earlier; a cluster's other
    callers and a directory changed after the preflight have only the worker's check): the
    driver prints the worker's UserError as one line, exits 2, and leaves no worker or
    placement group behind."""
    from reasonrl_fast import cli
    from reasonrl_fast.config import load_config
    from reasonrl_fast.trainer.cluster import Cluster

    cases = [(model_dir(tmp_path / "bare", "qwen2", weights=False), [], r"model\.path=.*bare.*has no weights"),
             (model_dir(tmp_path / "gpt2"), ["data.packing=true"], r"data\.packing=true: model_type 'gpt2'")]
    capsys.readouterr()  # save_pretrained's progress bar
    for path, extra, want in cases:
        cfg = load_config(None, ["trainer.workers_per_node=1", f"model.path={path}", *extra])
        with pytest.raises(SystemExit) as e:
            cli.main(lambda argv: Cluster(cfg, path), [])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and re.match("error: " + want, err), err
    groups = ray_local.util.placement_group_table().values()
    assert groups and all(g["state"] == "REMOVED" for g in groups)


def test_a_death_in_the_other_group_is_named_where_a_live_rank_failed_first(ray_local):
    """Split placement's weight transport spans the trainer workers and the rollout workers: a
    rollout worker that dies fails the trainer rank's collective first, and the run names the
    rollout worker that died, not the trainer rank that noticed."""
    from reasonrl_fast.rollout.group import WorkerGroup
    from reasonrl_fast.runtime.ray_cluster import WorkerError

    groups = []
    for role in ("worker", "rollout worker"):
        g = object.__new__(WorkerGroup)  # the group's waiting and naming, without its placement
        g.role, g.spec, g.log_dir = role, None, None
        groups.append(g)
    Rank = ray_local.remote(num_cpus=0)(collective_rank())
    trainers = [Rank.remote() for _ in range(2)]
    rollout = Rank.remote()
    calls = [(groups[0], [trainers[0].work.remote("fails"), trainers[1].work.remote("ok")]),
             (groups[1], [rollout.work.remote("dies")])]
    with pytest.raises(WorkerError, match="^rollout worker rank 0 died during weight transport") as e:
        WorkerGroup.gather_all(calls, "weight transport")
    assert "Connection reset by peer" in repr(e.value.__cause__)
