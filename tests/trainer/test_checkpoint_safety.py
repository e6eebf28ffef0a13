"""Checkpoints cannot run code, and resume / merge only read complete checkpoints that no other
user could have written to."""

import json
import os
import random
import subprocess
import sys

import pytest
import torch

from tests.helpers.ckpt import config, fake_checkpoint, scheduler
from reasonrl_fast.runtime import checkpoint as ckpt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _crafted_pickle(path, marker):
    """A pickle that, when loaded with weights_only=False, creates `marker`."""
    code = ("import pickle, sys\n"
            "class Evil:\n"
            "    def __reduce__(self):\n"
            f"        return (open, ({str(marker)!r}, 'w'))\n"
            f"open({str(path)!r}, 'wb').write(pickle.dumps(Evil()))\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rng_states_round_trip_as_tensors_and_json(tmp_path):
    sched = scheduler()
    for _ in range(3):
        sched.optimizer.step()
        sched.step()
    torch.manual_seed(1)
    random.seed(2)
    (tmp_path / "trainer_state.json").write_text(json.dumps({"world_size": 1}))
    ckpt.save_rng(str(tmp_path), 0, sched)
    want = (torch.rand(4), random.random())
    assert sorted(os.listdir(tmp_path)) == ["rng_rank0.safetensors", "trainer_state.json"]

    torch.manual_seed(99)
    random.seed(99)
    other = scheduler()
    ckpt.load_rng(str(tmp_path), 0, other)
    assert torch.equal(torch.rand(4), want[0]) and random.random() == want[1]
    assert other.state_dict() == sched.state_dict()


# A real Worker.save / Worker.load on a one-rank gloo group, with a crafted pickle planted where
# the old format kept the RNG states, and then in place of the new RNG file.
_WORKER = r"""
import os, shutil, sys, torch, torch.distributed as dist
from reasonrl_fast.trainer.worker import Worker
from reasonrl_fast.runtime import checkpoint as ckpt
path, marker, evil = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + path + "_store", rank=0, world_size=1)
w = Worker.__new__(Worker)
w.rank, w.world = 0, 1
w.actor = torch.nn.Linear(3, 2)
w.opt = torch.optim.AdamW(w.actor.parameters())
w.sched = torch.optim.lr_scheduler.LambdaLR(w.opt, lambda s: 1.0)
w.sync_weights = lambda: None
os.makedirs(path)
Worker.save(w, path)
with open(os.path.join(path, "trainer_state.json"), "w") as f:
    f.write('{"world_size": 1}')
for name in os.listdir(path):  # the RNG file the save wrote, whatever its format, is replaced
    if name.startswith("rng_rank"):
        shutil.copy(evil, os.path.join(path, name))
shutil.copy(evil, os.path.join(path, "rng_rank0.pt"))  # and the old format's name is planted too
print(outcome(Worker.load, w, path))
"""


@pytest.mark.proc
def test_crafted_rng_file_is_never_unpickled(tmp_path):
    from tests.helpers.childproc import run_snippet

    marker, evil = tmp_path / "pwned", tmp_path / "evil.bin"
    _crafted_pickle(evil, marker)
    p = run_snippet("import sys; sys.argv = ['x', %r, %r, %r]\n" % (str(tmp_path / "ck"), str(marker), str(evil))
                    + _WORKER, timeout=120)
    assert not marker.exists(), "loading the checkpoint ran code from a pickle"
    assert p.returncode == 0, p.stderr[-3000:]
    assert "CheckpointError" in p.stdout and "rng_rank0.safetensors" in p.stdout, p.stdout


def test_driver_state_is_json(tmp_path):
    path = fake_checkpoint(tmp_path, 2, "r1")
    state = ckpt.read_state(path)  # json.load: nothing to execute
    assert ckpt.as_tuple(state["python_rng"])[0] == 3  # random.getstate()'s version, back as a tuple
    assert not [f for f in state["files"] if f.endswith((".pt", ".pkl", ".bin"))]


def test_incomplete_checkpoint_auto_falls_back_explicit_fails(tmp_path):
    fake_checkpoint(tmp_path, 2, "r1")
    c4 = fake_checkpoint(tmp_path, 4, "r1")
    os.remove(os.path.join(c4, "rng_rank1.safetensors"))
    warnings = []
    got = ckpt.resolve_resume(str(tmp_path), "auto", warn=warnings.append)
    assert got == str(tmp_path / "checkpoint-2")
    assert "checkpoint-4" in warnings[0] and "rng_rank1.safetensors" in warnings[0]
    with pytest.raises(ckpt.CheckpointError, match="rng_rank1.safetensors"):
        ckpt.resolve_resume(str(tmp_path), c4)

    # a shard cut short is as bad as a missing one
    with open(tmp_path / "checkpoint-2" / "__1_0.distcp", "r+b") as f:
        f.truncate(10)
    assert ckpt.defects(str(tmp_path / "checkpoint-2")) == ["__1_0.distcp (size 10, written 64)"]
    assert ckpt.resolve_resume(str(tmp_path), "auto", warn=warnings.append) is None


def test_group_writable_or_foreign_checkpoint_is_refused(tmp_path):
    out = tmp_path / "run"
    path = fake_checkpoint(out, 2, "r1")
    assert ckpt.untrusted_files(path) == []  # what the trainer writes passes, whatever the umask
    meta = os.path.join(path, ".metadata")
    os.chmod(meta, 0o664)
    with pytest.raises(ckpt.CheckpointError, match=r"\.metadata \(group-writable\).*trainer\.trust_checkpoint=true"):
        ckpt.prepare_run(config(out))
    assert ckpt.prepare_run(config(out, "trainer.trust_checkpoint=true"))[0] == path
    os.chmod(meta, 0o644)
    os.chmod(path, 0o777)
    with pytest.raises(ckpt.CheckpointError, match="checkpoint-2 \\(world-writable\\)"):
        ckpt.prepare_run(config(out))
    os.chmod(path, 0o755)
    os.symlink(meta, os.path.join(path, "hf", "link"))
    assert ckpt.untrusted_files(path) == [os.path.join(path, "hf", "link") + " (symbolic link)"]
    os.remove(os.path.join(path, "hf", "link"))
    if os.getuid() == 0:  # only root can hand a file to another user
        os.chown(os.path.join(path, "hf"), 1234, 1234)
        assert ckpt.untrusted_files(path) == [os.path.join(path, "hf") + " (owned by uid 1234)"]


def test_merge_refuses_untrusted_and_incomplete(tmp_path, capsys):
    from reasonrl_fast import merge

    path = fake_checkpoint(tmp_path, 2, "r1")
    os.chmod(os.path.join(path, "__0_0.distcp"), 0o666)
    with pytest.raises(ckpt.CheckpointError, match="__0_0.distcp \\(world-writable\\).*--trust-checkpoint"):
        merge.merge(path, str(tmp_path / "out"))
    with pytest.raises(SystemExit) as exit_:
        merge.main([path, str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and "--trust-checkpoint" in err
    assert err.count("\n") == 1
    os.remove(os.path.join(path, "rng_rank0.safetensors"))
    with pytest.raises(ckpt.CheckpointError, match="missing or damaged: rng_rank0.safetensors"):
        merge.merge(path, str(tmp_path / "out"), trust=True)
    with pytest.raises(SystemExit):
        merge.main(["--help"])
    assert "trusted input" in capsys.readouterr().out
