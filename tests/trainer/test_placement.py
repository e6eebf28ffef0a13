"""Split placement (trainer.placement=split): the settings it refuses before Ray starts; the
weight transport between the trainer's rank 0 and the rollout workers; a few steps of the
embedded default on one trainer and one rollout worker, synchronous and one step stale."""

import pytest

from reasonrl_fast.config import ConfigError, load_config


def test_placement_settings_and_their_refusals():
    cfg = load_config(None, [])
    assert (cfg.trainer.placement, cfg.trainer.max_staleness, cfg.rollout.workers) == ("colocated", 0, 1)
    with pytest.raises(ConfigError, match=r"^trainer.max_staleness=1 needs trainer.placement=split"):
        load_config(None, ["trainer.max_staleness=1"])
    with pytest.raises(ConfigError, match=r"^rollout.sync_every=3 with trainer.placement=split: .*"
                                          r"trainer.max_staleness=2"):
        load_config(None, ["trainer.placement=split", "rollout.sync_every=3"])
    with pytest.raises(ConfigError, match=r"^trainer.placement='both': must be one of"):
        load_config(None, ["trainer.placement=both"])
    with pytest.raises(ConfigError, match=r"^trainer.max_staleness=-1"):
        load_config(None, ["trainer.placement=split", "trainer.max_staleness=-1"])
    cfg = load_config(None, ["trainer.placement=split", "trainer.max_staleness=2", "rollout.workers=3"])
    assert (cfg.trainer.max_staleness, cfg.rollout.workers) == (2, 3)
    # the engines' TP workers are their own in split placement: the trainer's count need not divide
    cfg = load_config(None, ["trainer.placement=split", "rollout.backend=vllm", "rollout.tensor_parallel_size=4"])
    assert cfg.rollout.tensor_parallel_size == 4
    with pytest.raises(ConfigError, match=r"does not divide trainer.workers_per_node"):
        load_config(None, ["rollout.backend=vllm", "rollout.tensor_parallel_size=4"])
