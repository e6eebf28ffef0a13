"""Split placement (trainer.placement=split): the settings it refuses before Ray starts; the
weight transport between the trainer's rank 0 and the rollout workers; a few steps of the
embedded default on one trainer and one rollout worker, synchronous and one step stale; a
killed worker of either role and Ctrl-C ending the run with nothing left running."""

import os
import re
import time

import pytest
import torch

from reasonrl_fast.data.records import prompt_ids
from reasonrl_fast.util import read_metrics

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
    with pytest.raises(ConfigError, match=r"^rollout.workers=5 with data.prompts_per_step=4 leaves"):
        load_config(None, ["trainer.placement=split", "rollout.workers=5", "data.prompts_per_step=4"])
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
    dtype, and the sender's transfer time leaves out its wait for receivers that join late; a
    receiver expecting another version fails instead of loading it."""
    import threading

    import torch

    from reasonrl_fast.rollout.transport import Transport, buckets, checksum, pack
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

    # the receivers join late, as a rollout worker still generating does: the sender's transfer
    # time starts once they have joined
    late = 1.0
    threads = [threading.Thread(target=lambda r: (time.sleep(late), receive(r, 3)), args=(r,)) for r in (1, 2)]
    [t.start() for t in threads]
    t0 = time.perf_counter()
    sent, transfer_s = ends[0].send(pack(iter(weights), meta, torch.bfloat16, 200), meta, 3, torch.bfloat16, 200)
    wall = time.perf_counter() - t0
    [t.join() for t in threads]
    assert sent == sum(t.numel() for _, t in weights) * 2
    assert wall >= late and 0 < transfer_s < late / 2, (wall, transfer_s)
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

    # the trainer's all-gather output as it is: 3 shards' rank-major buffers (runtime/shards.py),
    # each rank's torch.chunk pieces in slots of the largest, cut back into full tensors
    from reasonrl_fast.runtime.shards import slots

    def rank_major(idx, world=3):
        parts = []
        for k in range(world):
            for i, size in zip(idx, slots([meta[i][1] for i in idx], world)):
                t = weights[i][1].to(torch.bfloat16)
                piece = t.chunk(world)[k].reshape(-1) if k < len(t.chunk(world)) else t[:0].reshape(-1)
                parts += [piece, torch.zeros(size - piece.numel(), dtype=torch.bfloat16)]
        return torch.cat(parts)

    threads = [threading.Thread(target=lambda r: got.__setitem__(r, [(n, t.clone()) for n, t in ends[r].receive(
        meta, 6, torch.bfloat16, 200, 3)]), args=(r,)) for r in (1, 2)]
    [t.start() for t in threads]
    sent3, _ = ends[0].send((rank_major(idx) for idx in buckets(meta, 2, 200)), meta, 6, torch.bfloat16, 200, 3)
    [t.join() for t in threads]
    assert checksum(got[1]) == checksum(got[2]) == want
    assert sent3 > sent  # the shards' padding travels too (w0's 3 rows in 3 shards: none; w1's 4: 2 rows)


@pytest.mark.parametrize("k", [0, 1, 2])
def test_generation_runs_at_most_k_steps_ahead_and_each_is_trained_once(k, tmp_path):
    """The driver's side of bounded staleness (loop.py `_generation`, `_score_ahead`), on
    in-process stand-ins of the cluster and reward pool: each step's generation is submitted
    once, at most k steps ahead, tagged with the version published last, and (k >= 1) collected
    and scored while the update before it runs; each is trained exactly once, by its own step,
    on samples at most k versions older than the trainer's; the prompts are the sampler's in
    order, none skipped or repeated."""
    import threading

    import torch

    from reasonrl_fast.algos import get_algo
    from reasonrl_fast.models.tiny import char_tokenizer
    from reasonrl_fast.runtime.datasets import Sampler
    from reasonrl_fast.tasks import get_task
    from reasonrl_fast.trainer import loop
    from reasonrl_fast.trainer.logger import MetricsLogger
    from reasonrl_fast.util import read_metrics
    from tests.trainer.test_metric_names import TINY, FakePool, FakeWorkers

    steps = 5
    cfg = load_config(None, [*TINY, "algo=grpo", "rollout.sync_every=1", "trainer.placement=split",
                             f"trainer.max_staleness={k}", f"trainer.steps={steps}", "trainer.val_every=0",
                             f"trainer.output_dir={tmp_path}"])
    torch.manual_seed(0)
    tok = char_tokenizer()
    train_set = get_task("addition").split(cfg.data, 12, 0)

    class Recording(FakeWorkers):
        def __init__(self, *a):
            super().__init__(*a)
            self.submitted, self.trained, self.kept = [], [], None

        def submit(self, prompts, n, temperature, top_p, stream):
            p = super().submit(prompts, n, temperature, top_p, stream)
            p.stream, p.in_flight = stream, len(self.submitted) - len(self.trained)
            self.submitted.append((stream, self.version, [tuple(x) for x in prompts]))
            return p

        def collect(self, pending):
            yield from super().collect(pending)
            scored[pending.stream].set()  # the loop scores a share as it is yielded: all are now

        def keep(self, pending):
            super().keep(pending)
            self.kept = pending

        def train_step(self, adv, step):
            self.trained.append((step, self.kept.stream, self.kept.version))
            if k and step < steps:  # the next generation is collected and scored while this update runs
                assert scored[step + 1].wait(30), f"step {step + 1}'s generation was not scored during update {step}"
            return super().train_step(adv, step)

    scored = {s: threading.Event() for s in range(1, steps + 1)}
    cluster = Recording(cfg, tok)
    logger = MetricsLogger(cfg, str(tmp_path), 0, steps)
    run = loop.Run(cfg, "run", 0, tok, train_set, [], get_algo(cfg.algo), None, cluster, FakePool(),
                   Sampler(len(train_set), 0), logger)
    after = Sampler(len(train_set), 0)
    for step in range(1, steps + 1):
        loop._step(run, step)
        # a checkpoint of this step records the sampler as of it: the prompts in flight are drawn again
        after.next(cfg.data.prompts_per_step)
        assert loop._sampler_at(run).state() == after.state(), step
    logger.close()
    assert [s for s, _, _ in cluster.submitted] == list(range(1, steps + 1))  # each once, in order
    assert [(s, g) for s, g, _ in cluster.trained] == [(s, s) for s in range(1, steps + 1)]  # its own, once
    # generation s was submitted at step max(1, s - k), holding the version of the update before it
    assert [v for _, v, _ in cluster.submitted] == [max(0, s - k - 1) for s in range(1, steps + 1)]
    staleness = [s - 1 - v for s, _, v in cluster.trained]
    assert max(staleness) == min(k, steps - 1) and all(0 <= x <= k for x in staleness)
    rows = read_metrics(tmp_path)
    assert [r["rollout/staleness_max"] for r in rows] == staleness
    # the prompts: the sampler's, step after step, as a colocated run draws them
    order = Sampler(len(train_set), 0)
    want = [[tuple(prompt_ids(train_set[i], tok)) for i in order.next(cfg.data.prompts_per_step)]
            for _ in range(steps)]
    assert [p for _, _, p in cluster.submitted] == want


@pytest.mark.e2e
@pytest.mark.parametrize("workers,sharding", [(1, "auto"), (2, "fsdp")])
def test_split_cluster_publishes_identical_weights_to_its_rollout_worker(tmp_path, workers, sharding):
    """Trainer workers (one; two FSDP2 ranks, whose shards of uneven rows arrive in the
    rank-major layout) and one rollout worker on Ray: the rollout worker's engine holds the
    trainer's weights bit for bit (equal checksums) after setup's version 0 and after an update's
    publish, and the update did change them. An update published while a generation runs lands
    in it (the weight load in the rollout worker's concurrency group of its own, the generation
    going on under the new weights): responses that were still running carry both versions.
    Each worker runs a thread per CPU slot of its bundle. (One thread each: with more, the update
    can end after the generation it should land in, which the versions check would miss.)"""
    from reasonrl_fast.trainer.cluster import Cluster
    from tests.helpers.model_dirs import model_dir

    path = model_dir(tmp_path / "m", "llama")
    cfg = load_config(None, [f"model.path={path}", "trainer.placement=split", f"trainer.workers_per_node={workers}",
                             f"trainer.sharding={sharding}", "rollout.workers=1", "rollout.n=2",
                             "rollout.max_new_tokens=300", "data.prompts_per_step=2", "optim.mini_batch_prompts=2",
                             "optim.lr=1e-2", f"trainer.output_dir={tmp_path / 'run'}"])
    import ray

    # a CPU for each trainer worker and the rollout worker
    ray.init(address="local", num_cpus=workers + 1, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    cluster = None
    try:
        cluster = Cluster(cfg, str(path))
        assert cluster._shards == workers  # the layout the receivers cut: the trainer's shard count
        threads = lambda actors: ray.get([a.__ray_call__.remote(lambda _: torch.get_num_threads())  # noqa: E731
                                          for a in actors])
        assert threads(cluster.workers) == [1] * workers and threads(cluster.rollout.actors) == [1]
        trainer, (rollout,) = cluster.weights_checksums()
        assert trainer == rollout and cluster.version == 0
        pending = cluster.submit([[5, 6, 7], [8, 9]], 2, 1.0, 1.0, 1)
        assert pending.version == 0 and len(list(cluster.collect(pending))) == 1
        cluster.keep(pending)
        metrics = cluster.train_step([1.0, -1.0, 0.5, -0.5], 1)
        assert cluster.version == 1 and metrics["time/sync_s"] > 0
        trained, (loaded,) = cluster.weights_checksums()
        assert trained == loaded and trained != trainer
        # 32 responses of up to 300 tokens (a random model's: few end early) while update 2 runs
        long = cluster.submit([[5, 6, 7], [8, 9]] * 8, 2, 1.0, 1.0, 2)
        cluster.keep(pending)
        cluster.train_step([1.0, -1.0, 0.5, -0.5], 2)
        list(cluster.collect(long))
        assert all(v[0] == (0, 1) and all(version in (1, 2) for _, version in v) for v in long.versions), long.versions
        landed = [v for v in long.versions if len(v) == 2]
        assert landed and len({v[1][0] for v in landed}) == 1, long.versions  # one token boundary for the batch
        assert long.staleness(2)["rollout/partial_frac"] == len(landed) / 32
    finally:
        if cluster is not None:
            cluster.shutdown()
        ray.shutdown()


@pytest.mark.parametrize("k", [0, 1])
def test_split_placement_trains_the_embedded_default(train, tmp_path, k):
    """The embedded default, a few steps on one trainer and one rollout worker. k=0: the
    rollout workers sample the weights of the last update, so the sampler's and the trainer's
    log-probs agree as closely as colocated workers' (tests/trainer/test_stale_rollout.py: below
    1e-4 on the steps that sample the current policy). k=1: each step after the first trains on
    samples one version old, the gap shows, and every step trains. k=1 gives the trainer worker
    two threads: three CPU slots over this machine's two cores (or fewer), which the log says."""
    out = tmp_path / "run"
    cpus = ["trainer.cpus_per_worker=2", "rollout.cpus_per_worker=1"] if k else []
    p = train(["trainer.placement=split", "trainer.workers_per_node=1", "rollout.workers=1", "trainer.steps=4",
               "trainer.val_every=0", f"trainer.max_staleness={k}", "rollout.correction=token_tis", *cpus,
               f"trainer.output_dir={out}"], tmp_path, timeout=600, tiny=False)
    assert "placement: split, 1 trainer worker(s) and 1 rollout engine(s)" in p.stdout
    assert f"on CPU: {k + 1} and 1 thread(s) a worker; the two roles share the node's cores" in p.stdout
    if k and (os.cpu_count() or 1) < 3:
        assert "the workers' 3 CPU slots over-subscribe this machine's" in p.stdout
        assert f"(OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'PASSIVE')} in the workers)" in p.stdout
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    diff = [r["rollout/logprob_diff_mean"] for r in rows]
    assert [r["rollout/staleness_max"] for r in rows] == [0] + [k] * 3
    # an update lands mid-generation only where one is in flight: never at k=0 (submitted after it)
    assert all(0 <= r["rollout/staleness_mean"] <= r["rollout/staleness_max"] for r in rows)
    assert all(0 <= r["rollout/partial_frac"] <= (1 if k else 0) for r in rows)
    assert all(r["time/trainer_idle_s"] >= 0 and r["time/rollout_idle_s"] >= 0 for r in rows)
    # every publish sends the whole model (float32 here) and its transfer is part of the publish
    assert len({r["perf/sync_gb"] for r in rows}) == 1 and rows[0]["perf/sync_gb"] > 0
    assert all(0 < r["time/transport_s"] <= r["time/sync_s"] for r in rows)
    assert "rollout.correction=none" not in p.stdout
    if k == 0:
        assert max(diff) < 1e-4, diff
    else:
        assert diff[0] < 1e-4 and min(diff[1:]) > 1e-3, diff


def test_split_placement_resumes_with_generations_in_flight(train, tmp_path):
    """A run with max_staleness=1 checkpoints step 2 while step 3's generation is in flight: the
    checkpoint's sampler is as of step 2 (step 3's prompts are drawn again), and the resumed run
    publishes the checkpoint's weights as version 2, so its step 3 samples the current policy."""
    import json

    out = tmp_path / "run"
    args = ["trainer.placement=split", "trainer.workers_per_node=1", "rollout.workers=1", "trainer.val_every=0",
            "trainer.max_staleness=1", "trainer.save_every=2", f"trainer.output_dir={out}"]
    p = train(args + ["trainer.steps=2"], tmp_path)
    assert "rollout.correction=none: the update does not weigh their gap" in p.stdout
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["sampler"] == {"epoch": 0, "pos": 2 * 4}  # two steps of data.prompts_per_step=4
    p = train(args + ["trainer.steps=4"], tmp_path)
    assert "resumed from" in p.stdout
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["rollout/staleness_max"] for r in rows] == [0, 1, 0, 1]


SPLIT_FAILING = ["trainer.placement=split", "trainer.workers_per_node=2", "rollout.workers=1", "trainer.val_every=0",
                 "trainer.max_staleness=1"]


@pytest.mark.e2e
@pytest.mark.parametrize("victim, says", [
    ("kills_a_rollout_worker", r"rollout worker rank 0 (died|failed) during (generate|weight transport)"),
    ("kills_a_worker", r"(?<!rollout )worker rank [01] (died|failed) during (train_step|weight transport)")])
def test_split_placement_a_killed_worker_ends_the_run_naming_it_and_leaves_no_process(tmp_path, victim, says):
    """A rollout worker or a trainer worker SIGKILLed mid-run (by the first reward call, while the
    other role may be generating the step ahead, training, or in the weight transport with it):
    the run ends with the dead worker named by its role and rank, long before a collective's
    timeout, and nothing it started is left running."""
    from tests.helpers.procs import Watch
    from tests.helpers.train import popen_train

    t = time.monotonic()
    p = popen_train([*SPLIT_FAILING, "trainer.steps=3", f"trainer.output_dir={tmp_path / 'run'}",
                     f"data.reward_fn=tests.helpers.faulty_rewards:{victim}"], tmp_path)
    watch = Watch(p)
    out, err = p.communicate(timeout=300)
    assert "killing " in out, out[-2000:] + err[-2000:]
    assert p.returncode != 0 and re.search(says, err), err[-3000:]
    assert time.monotonic() - t < 200  # not the collective timeout
    assert watch.left_behind() == []


@pytest.mark.e2e
def test_split_placement_ctrl_c_leaves_no_process(tmp_path):
    from tests.helpers.procs import Watch, interrupt_once_training, reaped
    from tests.helpers.train import popen_train

    out = tmp_path / "run"
    p = popen_train([*SPLIT_FAILING, "trainer.steps=100000", f"trainer.output_dir={out}"], tmp_path)
    watch = Watch(p)
    with reaped(p):
        stdout, stderr = interrupt_once_training(p, out, watch)
    assert p.returncode != 0, f"exit {p.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
    assert watch.left_behind() == []


def test_split_placement_on_too_few_local_gpus_is_refused_before_ray_starts(monkeypatch):
    import torch

    from reasonrl_fast import preflight

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    ok = load_config(None, ["trainer.placement=split", "trainer.workers_per_node=2", "rollout.workers=2"])
    preflight._check_split_devices(ok)  # 2 + 2 of 4
    cfg = load_config(None, ["trainer.placement=split", "trainer.workers_per_node=2", "rollout.workers=3"])
    with pytest.raises(ConfigError, match=r"^rollout.workers=3 x rollout.tensor_parallel_size=1 rollout workers "
                                          r"beside 2 trainer workers need 5 GPUs .*this node has 4$"):
        preflight._check_split_devices(cfg)
    preflight._check_split_devices(load_config(None, ["trainer.workers_per_node=2", "rollout.workers=3"]))  # colocated
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    preflight._check_split_devices(cfg)  # CPU: the roles share the cores


def test_a_rollout_workers_idle_time_counts_from_its_first_generation():
    """`sample_timed` reports the gaps between a rollout worker's calls since its last
    generation: the run's setup (version 0 received, the first generation not yet asked for) is
    not a wait, a wait for the next weights is (it made split placement's rollout busy fraction
    negative on a loaded machine, the setup longer than the short run's steps)."""
    from types import SimpleNamespace

    import threading

    from reasonrl_fast.rollout.handoff import Handoff
    from reasonrl_fast.rollout.worker import RolloutWorker

    w = object.__new__(RolloutWorker)
    w.handoff, w._idle_lock = Handoff(), threading.Lock()
    w.own_threads = lambda: None  # no settings here: pytest's threads stay as they are
    w.transport = SimpleNamespace(receive=lambda *a: iter(()))
    w.engine = SimpleNamespace(load_weights=lambda named: list(named))
    w.sample = lambda *a: SimpleNamespace(tokens=[[1]], logprobs=[[0.0]])
    w.receive_weights([], "float32", 0, 1)  # setup's version 0
    time.sleep(0.3)  # the rest of the setup
    assert w.sample_timed([[5]], 1, 1.0, 1.0, [0])[3] == 0.0
    time.sleep(0.2)  # waits for the update's weights
    w.receive_weights([], "float32", 1, 1)
    time.sleep(0.1)
    idle = w.sample_timed([[5]], 1, 1.0, 1.0, [0])[3]
    assert 0.3 <= idle < 0.5, idle
