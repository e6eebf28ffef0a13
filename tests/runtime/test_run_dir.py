"""The run directory: a fresh run never mixes with (or prunes) an earlier run's checkpoints, never
deletes or overwrites what this trainer did not write, one trainer at a time holds it, and a
metrics.jsonl cut off by a crash does not block resume."""

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

from tests.helpers.ckpt import config, fake_checkpoint
from reasonrl_fast.config import to_yaml
from reasonrl_fast.runtime import checkpoint as ckpt
from reasonrl_fast.trainer.logger import MetricsLogger
from reasonrl_fast.util import read_metrics as read_rows


def _names(d):
    return sorted(n for n in os.listdir(d) if n.startswith("checkpoint-"))


def _ours(out):
    """The config.yaml an earlier run of this trainer left in `out`."""
    (out / "config.yaml").write_text(to_yaml(config(out)))


def test_fresh_run_refuses_an_earlier_runs_checkpoints(tmp_path):
    _ours(tmp_path)
    fake_checkpoint(tmp_path, 3, "old")
    fake_checkpoint(tmp_path, 4, "old")
    (tmp_path / "metrics.jsonl").write_text('{"step": 4}\n')
    for resume in ("never", "auto_but_broken"):
        if resume == "auto_but_broken":  # nothing resumable left: auto starts fresh, so the same rule
            for name in _names(tmp_path):
                os.remove(tmp_path / name / "rng_rank0.safetensors")
            resume = "auto"
        with pytest.raises(ckpt.CheckpointError, match="checkpoint-3, checkpoint-4.*trainer.overwrite=true"):
            ckpt.prepare_run(config(tmp_path, f"trainer.resume={resume}"), warn=lambda m: None)
        assert _names(tmp_path) == ["checkpoint-3", "checkpoint-4"]
        assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 4}\n'


def test_overwrite_clears_the_earlier_run(tmp_path):
    fake_checkpoint(tmp_path, 3, "old")
    (tmp_path / "checkpoint-5.tmp").mkdir()
    (tmp_path / "metrics.jsonl").write_text('{"step": 3}\n')
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events").write_text("x")
    (tmp_path / "notes.txt").write_text("mine")
    _ours(tmp_path)
    assert ckpt.prepare_run(config(tmp_path, "trainer.overwrite=true")) == (None, None)
    assert sorted(os.listdir(tmp_path)) == ["config.yaml", "notes.txt"]


def _tree(d):
    return sorted(os.path.relpath(os.path.join(r, n), d) for r, ds, fs in os.walk(d) for n in ds + fs)


@pytest.mark.parametrize("overwrite", ["true", "false"])
@pytest.mark.parametrize("config_yaml", [None, "seed: 3\nlr: 0.1\n", "algo: [\n"])
def test_a_fresh_run_refuses_run_files_it_did_not_write(tmp_path, overwrite, config_yaml):
    """metrics.jsonl and tensorboard/ of another tool (no config.yaml of ours beside them: none, one
    of another tool, one that is no YAML) are named, and nothing is deleted or overwritten."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 4}\n')
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events").write_text("x")
    if config_yaml is not None:
        (tmp_path / "config.yaml").write_text(config_yaml)
    before = {n: (tmp_path / n).read_text() for n in ("metrics.jsonl", "tensorboard/events")}
    names = _tree(tmp_path)
    listed = "config.yaml, metrics.jsonl, tensorboard" if config_yaml else "metrics.jsonl, tensorboard"
    with pytest.raises(ckpt.CheckpointError, match=f"holds {listed}, which this trainer did not write"):
        ckpt.prepare_run(config(tmp_path, f"trainer.overwrite={overwrite}"), warn=lambda m: None)
    with pytest.raises(ckpt.CheckpointError, match="which this trainer did not write"):
        ckpt.clear_run(str(tmp_path))
    assert _tree(tmp_path) == names
    assert {n: (tmp_path / n).read_text() for n in before} == before


def test_a_checkpoint_folder_another_trainer_wrote_is_not_deleted(tmp_path):
    """Hugging Face's Trainer names its checkpoints checkpoint-N too (with a trainer_state.json)."""
    _ours(tmp_path)
    fake_checkpoint(tmp_path, 3, "old")
    hf = tmp_path / "checkpoint-500"
    hf.mkdir()
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
        (hf / name).write_text("x")
    names = _tree(tmp_path)
    for overwrite in ("true", "false"):
        with pytest.raises(ckpt.CheckpointError, match="holds checkpoint-500, which this trainer did not write"):
            ckpt.prepare_run(config(tmp_path, f"trainer.overwrite={overwrite}"), warn=lambda m: None)
    assert _tree(tmp_path) == names
    # nor does a save replace it, mid-save folder or finished one
    hf = hf.rename(tmp_path / "checkpoint-500.tmp")
    with pytest.raises(ckpt.CheckpointError, match="checkpoint-500.tmp: not a checkpoint this trainer wrote"):
        ckpt.tmp_path(str(tmp_path), 500)
    assert len(list(hf.iterdir())) == 3
    os.remove(hf / "model.safetensors")
    os.remove(hf / "optimizer.pt")
    os.remove(hf / "trainer_state.json")
    assert ckpt.prepare_run(config(tmp_path, "trainer.overwrite=true")) == (None, None)
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]  # an empty one and ours: deleted


def test_resume_keeps_the_run_id_and_metrics_only_runs_start_over(tmp_path):
    path = fake_checkpoint(tmp_path, 2, "abc")
    got, state = ckpt.prepare_run(config(tmp_path))
    assert got == path and state.run_id == "abc" and state.step == 2

    other = tmp_path / "metrics_only"
    other.mkdir()
    _ours(other)
    (other / "metrics.jsonl").write_text('{"step": 150}\n')
    said = []
    assert ckpt.prepare_run(config(other), warn=said.append) == (None, None)
    assert not (other / "metrics.jsonl").exists() and "starting over" in said[0]


def test_prune_only_this_runs_checkpoints(tmp_path):
    fake_checkpoint(tmp_path, 3, "old")
    fake_checkpoint(tmp_path, 4, "old")
    fake_checkpoint(tmp_path, 1, "new", keep=2)
    fake_checkpoint(tmp_path, 2, "new", keep=2)
    assert _names(tmp_path) == ["checkpoint-1", "checkpoint-2", "checkpoint-3", "checkpoint-4"]
    fake_checkpoint(tmp_path, 3, "new", keep=2)  # replaces old's checkpoint-3 (same path)
    assert _names(tmp_path) == ["checkpoint-2", "checkpoint-3", "checkpoint-4"]
    assert ckpt.read_state(str(tmp_path / "checkpoint-4"))["run_id"] == "old"


@pytest.mark.proc
def test_run_dir_lock(tmp_path):
    with ckpt.locked(str(tmp_path)):
        with pytest.raises(ckpt.CheckpointError, match=f"{tmp_path} is in use by another trainer \\(pid {os.getpid()}\\)"):
            with ckpt.locked(str(tmp_path)):
                pass
    with ckpt.locked(str(tmp_path)):  # released on exit
        pass
    # a holder killed with SIGKILL releases it too (the kernel drops the flock)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]);"
                               "from reasonrl_fast.runtime.checkpoint import locked\n"
                               "with locked(sys.argv[2]):\n    print('held', flush=True); time.sleep(60)",
                               os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                               str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ckpt.CheckpointError, match=f"pid {holder.pid}"):
            with ckpt.locked(str(tmp_path)):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with ckpt.locked(str(tmp_path)):
        pass


@pytest.mark.proc  # the trainer exits before Ray starts
def test_second_trainer_on_a_locked_dir_fails_at_once(tmp_path):
    from tests.helpers.train import run_train

    out = tmp_path / "run"
    with ckpt.locked(str(out)):
        t = time.time()
        p = run_train([f"trainer.output_dir={out}", "trainer.steps=1"], tmp_path, timeout=120, check=False)
    assert p.returncode != 0 and time.time() - t < 60
    assert f"{out} is in use by another trainer (pid {os.getpid()})" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr


def _logger(out, start):
    return MetricsLogger(config(out, "trainer.logger=none", "trainer.progress=false"), str(out), start, 10)


def test_torn_last_metrics_line_is_dropped(tmp_path):
    rows = [{"step": s, "reward/mean": 0.5} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "rew')
    with pytest.warns(UserWarning, match="metrics.jsonl, line 4: dropping a cut-off last line"):
        _logger(tmp_path, 2).close()
    assert read_rows(str(tmp_path / "metrics.jsonl")) == rows[:2]


def test_torn_line_in_the_middle_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="metrics.jsonl, line 2: not valid JSON"):
            _logger(tmp_path, 3)
