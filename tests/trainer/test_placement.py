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


def test_the_transport_delivers_identical_weights_in_buckets_with_their_version():
    """Two ends of the transport (threads of one process here; Ray actors in a run): what the
    sender broadcasts bucket by bucket arrives bit for bit (equal checksums), cast to the sent
    dtype; a receiver expecting another version fails instead of loading it."""
    import threading

    import torch

    from reasonrl_fast.rollout.transport import Transport, buckets, checksum
    from reasonrl_fast.runtime.distributed import rendezvous_socket

    torch.manual_seed(0)
    weights = [(f"w{i}", torch.randn(3 + i, 5)) for i in range(7)] + [("big", torch.randn(64, 64))]
    meta = [(n, tuple(t.shape)) for n, t in weights]
    assert buckets(meta, 4, 200)[-1] == [7] and len(buckets(meta, 4, 200)) > 2  # the large one alone
    listen = rendezvous_socket("127.0.0.1")
    port = listen.getsockname()[1]
    ends, got = {}, {}

    def join(rank):
        ends[rank] = Transport("127.0.0.1", port, rank, 3, 60, listen if rank == 0 else None)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]

    def receive(rank, version):
        try:
            got[rank] = [(n, t.clone()) for n, t in ends[rank].receive(meta, version, torch.bfloat16, 200)]
        except RuntimeError as e:
            got[rank] = e

    threads = [threading.Thread(target=receive, args=(r, 3)) for r in (1, 2)]
    [t.start() for t in threads]
    sent = ends[0].send(iter(weights), meta, 3, torch.bfloat16, 200)
    [t.join() for t in threads]
    assert sent == sum(t.numel() for _, t in weights) * 2
    want = checksum([(n, t.to(torch.bfloat16)) for n, t in weights])
    assert checksum(got[1]) == checksum(got[2]) == want
    assert all(t.dtype == torch.bfloat16 for _, t in got[1])

    def receive_empty(rank):
        try:
            list(ends[rank].receive([], 4, torch.bfloat16, 200))
        except RuntimeError as e:
            got[rank] = e

    threads = [threading.Thread(target=receive_empty, args=(r,)) for r in (1, 2)]
    [t.start() for t in threads]
    ends[0].send(iter([]), [], 5, torch.bfloat16, 200)  # the header only
    [t.join() for t in threads]
    assert all(isinstance(got[r], RuntimeError) and "version 5 with 0 tensors arrived where version 4" in str(got[r])
               for r in (1, 2))
