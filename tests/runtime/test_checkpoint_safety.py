"""Checkpoints cannot run code, resume / merge only read complete checkpoints that no other
user could have written to, and nothing in a checkpoint makes them read a FIFO, a device, a link
or a file outside it, or take a damaged RNG state whose checksum was recomputed."""

import json
import os
import random
import subprocess
import sys
import zlib

import pytest
import torch

from tests.helpers.ckpt import cli_error, config, fake_checkpoint, memory_cap, relist, scheduler
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


# ---------------------------------------------------------------- what a checkpoint may make us read

def _fifo(path, name=ckpt.STATE):
    os.remove(os.path.join(path, name))
    os.mkfifo(os.path.join(path, name))


@pytest.mark.timeout(30)
def test_fifo_trainer_state_is_named_not_waited_on(tmp_path, capsys):
    from reasonrl_fast import merge

    path = fake_checkpoint(tmp_path, 2, "r1")
    _fifo(path)
    warnings = []
    assert ckpt.resolve_resume(str(tmp_path), "auto", warn=warnings.append) is None
    assert "trainer_state.json (a FIFO, not a regular file)" in warnings[0]
    with pytest.raises(ckpt.CheckpointError, match=r"trainer_state\.json \(a FIFO"):
        ckpt.prepare_run(config(tmp_path, f"trainer.resume={path}"))
    err = cli_error(capsys, merge.main, [path, str(tmp_path / "out")])
    assert "trainer_state.json (a FIFO, not a regular file)" in err


@pytest.mark.timeout(30)
def test_a_fifo_or_link_among_the_listed_files_is_not_read(tmp_path):
    path = fake_checkpoint(tmp_path, 2, "r1")
    with open(os.path.join(path, "rng_rank0.safetensors"), "rb") as f:
        rng = f.read()
    _fifo(path, "hf/config.json")
    _fifo(path, "rng_rank0.safetensors")
    assert ckpt.defects(path) == [f"{rel} (a FIFO, not a regular file)"
                                  for rel in ("hf/config.json", "rng_rank0.safetensors")]
    with pytest.raises(ckpt.CheckpointError, match=r"rng_rank0\.safetensors: a FIFO, not a regular file"):
        ckpt.load_rng(path, 0, scheduler())  # what a worker calls
    os.remove(os.path.join(path, "hf/config.json"))
    os.remove(os.path.join(path, "rng_rank0.safetensors"))
    with open(os.path.join(path, "rng_rank0.safetensors"), "wb") as f:
        f.write(rng)
    # a folder on the way that is a link: the file behind it is not the checkpoint's
    os.rename(os.path.join(path, "hf"), tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "config.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere", os.path.join(path, "hf"))
    assert ckpt.defects(path) == [f"{rel} (hf is a symbolic link, not a folder)"
                                  for rel in ("hf/config.json", "hf/tokenizer.json")]


@pytest.mark.timeout(60)
def test_trainer_state_linked_to_dev_zero_is_not_read(tmp_path, capsys):
    from reasonrl_fast import merge

    path = fake_checkpoint(tmp_path, 2, "r1")
    os.remove(os.path.join(path, ckpt.STATE))
    os.symlink("/dev/zero", os.path.join(path, ckpt.STATE))
    with memory_cap():
        assert ckpt.defects(path) == ["trainer_state.json (a symbolic link, not a regular file)"]
        err = cli_error(capsys, merge.main, [path, str(tmp_path / "out"), "--trust-checkpoint"])
    assert "trainer_state.json (a symbolic link" in err


@pytest.mark.parametrize("outside", ["relative", "absolute"])
def test_a_listed_file_outside_the_checkpoint_is_refused_unread(tmp_path, capsys, outside):
    from reasonrl_fast import merge

    path = fake_checkpoint(tmp_path, 2, "r1")
    target = "/etc/passwd"
    rel = os.path.relpath(target, path) if outside == "relative" else target
    relist(path, rel, crc="00000000")  # its true size: only a read would tell it apart
    with open(target, "rb") as f:
        secret = f.read()
    err = cli_error(capsys, merge.main, [path, str(tmp_path / "out")])
    assert f"`files` entry {rel!r} is not a file name in the checkpoint" in err
    assert f"{zlib.crc32(secret):08x}" not in err and secret.split(b"\n")[0].decode() not in err
    with pytest.raises(ckpt.CheckpointError, match="is not a file name in the checkpoint"):
        ckpt.resolve_resume(str(tmp_path), path)
    for bad in ["", "hf/", "a/b", "hf/../x", "./x", "x\0y", "hf/sub/x"]:
        assert not ckpt.entry_ok(bad), bad


def _rng_file(torch_state=None, python=None, sched=None):
    """An RNG file as save_rng writes it, with any of its parts replaced."""
    from safetensors.torch import save

    meta = {"python": json.dumps(random.getstate()), "sched": json.dumps(scheduler().state_dict())}
    if python is not None:
        meta["python"] = json.dumps(python)
    if sched is not None:
        meta["sched"] = json.dumps(sched)
    return save({"torch": torch.get_rng_state() if torch_state is None else torch_state}, metadata=meta)


@pytest.mark.parametrize("damage, named", [
    (dict(torch_state=torch.zeros(16, dtype=torch.uint8)), "a uint8 tensor of 5056 values expected, found uint8 [16]"),
    (dict(torch_state=torch.zeros(5056, dtype=torch.float32)), "found float32 [5056]"),
    (dict(python=[3, [1, 2, 3], None]), "Python's random state must be"),
    (dict(python=[3, [2**40] * 625, None]), "Python's random state must be"),
    # the scheduler's state is checked against the worker's scheduler (the driver has none)
    (dict(sched={"base_lrs": "0.1", "last_epoch": 0}), "sched.base_lrs: a list of 1 expected"),
    (dict(sched={"base_lrs": [0.1], "last_epoch": "3"}), "sched.last_epoch: an integer expected"),
    (dict(sched=[0.1]), "sched: an object expected"),
])
def test_rng_file_with_a_recomputed_checksum_is_checked_by_content(tmp_path, damage, named):
    path = fake_checkpoint(tmp_path, 2, "r1")
    relist(path, "rng_rank1.safetensors", _rng_file(**damage))
    assert ckpt.defects(path) == []  # the checksums cannot see it
    before, sched = torch.get_rng_state(), scheduler()
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.load_rng(path, 1, sched)
    assert str(e.value).startswith(os.path.join(path, "rng_rank1.safetensors") + ": not an RNG state file")
    assert named in str(e.value) and "\n" not in str(e.value)
    assert torch.equal(torch.get_rng_state(), before) and sched.state_dict() == scheduler().state_dict()
    ckpt.load_rng(path, 0, sched)  # the other rank's file is intact
    # the driver checks every rank's file before any worker starts, as far as it can
    if "sched" in damage and isinstance(damage["sched"], dict):
        assert ckpt.prepare_run(config(tmp_path))[0] == path
    else:
        with pytest.raises(ckpt.CheckpointError, match=r"rng_rank1\.safetensors: not an RNG state file"):
            ckpt.prepare_run(config(tmp_path))


def test_trainer_state_with_a_recomputed_checksum_is_checked_by_content(tmp_path):
    path = fake_checkpoint(tmp_path, 2, "r1")
    state = ckpt.read_state(path)
    state["python_rng"] = [3, [0] * 10, None]
    with open(os.path.join(path, ckpt.STATE), "w") as f:
        json.dump(state, f)
    with pytest.raises(ckpt.CheckpointError, match=r"trainer_state\.json: not what the trainer writes "
                                                   r"\(Python's random state must be"):
        ckpt.prepare_run(config(tmp_path))
