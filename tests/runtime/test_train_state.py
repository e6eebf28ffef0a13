"""The driver's part of a checkpoint (checkpoint/format.py TrainState): what the save writes is
what resume reads back and restores, and a trainer_state.json that lacks a value the driver
relies on is refused with one line before anything starts."""

import json
import os
import random

import pytest

from reasonrl_fast.runtime import checkpoint as ckpt
from reasonrl_fast.runtime import resume
from reasonrl_fast.runtime.datasets import Sampler
from tests.helpers.ckpt import config, fake_checkpoint


def test_the_saved_state_is_the_state_resume_restores(tmp_path):
    sampler = Sampler(10, 0, True)
    sampler.next(4)
    random.seed(7)
    saved = ckpt.TrainState.now(3, "abc", 2, sampler, resume.settings(config(tmp_path)))
    expected = random.random()  # what the driver draws next after the save
    path = fake_checkpoint(tmp_path, 3, "abc")
    state = ckpt.read_state(path)
    state.update({k: v for k, v in saved.to_json().items() if k not in ("files", "checksums", "world_size")})
    with open(os.path.join(path, ckpt.STATE), "w") as f:
        json.dump(state, f)
    got, loaded = ckpt.prepare_run(config(tmp_path), warn=lambda m: None)
    assert got == path and isinstance(loaded, ckpt.TrainState)
    assert (loaded.step, loaded.run_id, loaded.sampler, loaded.config) == (3, "abc", saved.sampler, saved.config)
    assert loaded.python_rng == saved.python_rng  # back as random.getstate()'s tuples
    assert loaded.to_json() == state  # read back whole: nothing the save wrote is dropped
    fresh = Sampler(10, 0, True)
    random.seed(0)
    loaded.restore(fresh)
    assert random.random() == expected and fresh.next(2) == sampler.next(2)


@pytest.mark.parametrize("change, named", [
    (lambda s: s.pop("run_id"), "run_id must be a string"),
    (lambda s: s.update(run_id=7), "run_id must be a string"),
    (lambda s: s.update(config=["algo"]), "config (the run's settings) must be an object"),
    (lambda s: s.update(config=None), "config (the run's settings) must be an object"),
])
def test_a_state_without_what_the_driver_relies_on_is_refused(tmp_path, change, named):
    path = fake_checkpoint(tmp_path, 2, "r1")
    state = ckpt.read_state(path)
    change(state)
    with open(os.path.join(path, ckpt.STATE), "w") as f:
        json.dump(state, f)
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.prepare_run(config(tmp_path), warn=lambda m: None)
    msg = str(e.value)
    assert msg.startswith(os.path.join(path, ckpt.STATE) + ": not what the trainer writes")
    assert named in msg and "\n" not in msg
