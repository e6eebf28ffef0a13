"""Fake checkpoints for the checkpoint and run-directory tests: the files a real save writes
(DCP metadata and shards, per-rank RNG states, trainer_state.json with the file list, hf/), without
a model, a process group or Ray; and ways to change one behind the checksums' back."""

import contextlib
import json
import os
import random
import re
import resource
import zlib

import pytest
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
    state = ckpt.TrainState(step, run_id, world, {"epoch": 0, "pos": 0}, random.getstate())
    return ckpt.finalize(tmp, state, Saver("tokenizer.json"), Saver("config.json"), keep)


def config(out, *overrides):
    return load_config(None, [f"trainer.output_dir={out}", *overrides])


def relist(path, rel, data=None, crc=None):
    """Write `data` to `rel` of the checkpoint (None: leave the file) and record it in
    trainer_state.json as a save would (its size and CRC-32, or `crc`): a change the checksums
    cannot see, as a writer that recomputes them makes."""
    if data is not None:
        with open(os.path.join(path, rel), "wb") as f:
            f.write(data)
        size, crc = len(data), crc or f"{zlib.crc32(data):08x}"
    else:
        size = os.path.getsize(os.path.join(path, rel))
    state = ckpt.read_state(path)
    state["files"][rel], state["checksums"][rel] = size, crc
    with open(os.path.join(path, ckpt.STATE), "w") as f:
        json.dump(state, f)


@contextlib.contextmanager
def memory_cap(extra=512 << 20):
    """Allocations past this process's data segment now plus `extra` fail with MemoryError for
    the block's duration: a regression that reads a device like /dev/zero to its end fails the
    test instead of the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    with open("/proc/self/status") as f:
        now = int(re.search(r"VmData:\s+(\d+) kB", f.read()).group(1)) * 1024
    cap = now + extra if hard == resource.RLIM_INFINITY else min(hard, now + extra)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def cli_error(capsys, main, argv):
    """The one line a CLI prints for a UserError (exit status 2), checked to be just that."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err[-3000:]
    return err
