"""The trainer's workers on Ray: `nnodes x workers_per_node` worker actors, a group of rollout
workers (rollout/group.py `WorkerGroup`: placed through a placement group, wired into one
torch.distributed group); calls fan out to all of them. Each worker keeps the samples it generated
for the step (`WorkerGroup.shares` is the one split rule), so the driver sends back only their
advantages.

Split placement (trainer.placement=split): a group of trainer workers without engines and a group
of rollout workers (rollout.workers engines, each rollout.tensor_parallel_size wide). The
rollout workers' responses and sampler log-probs come to the driver (token ids and floats), which
sends each trainer worker its share with the advantages; after each update the trainer's rank 0
publishes the weights to the rollout workers (rollout/transport.py), as version `version`. A
generation is submitted (`submit`) and collected (`collect`) apart, so the driver can keep some in
flight while the trainer updates (loop.py, trainer.max_staleness). With an engine that takes
weights between tokens (the hf engine, vLLM's of one process: `EngineSpec.between_tokens`) a
rollout worker loads them in a thread of its own at once, its generation in flight pausing at its
next token and going on under the new weights (partial rollouts, rollout/handoff.py); each
response carries the versions of its tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from reasonrl_fast.algos.correction import pool_sums, rollout_metrics
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.models.loading import load_model_config
from reasonrl_fast.rollout import get_rollout, sample_seeds
from reasonrl_fast.rollout.group import WorkerGroup, cluster_gpus, worker_bundle
from reasonrl_fast.rollout.worker import RolloutWorker
from reasonrl_fast.runtime.ray_cluster import ClusterError, start_ray, stop_ray
from reasonrl_fast.trainer.worker import ROLLOUT_SUMS, Worker


@dataclass
class Pending:
    """A submitted generation (split placement): its refs, each rollout worker's (engine's
    prompts, own prompts), the weights' version published when it was submitted (its tokens'
    oldest possible: a publish after it can land mid-generation, or before it starts), and what
    `collect` gathers: responses, sampler log-probs and each response's versions, its (first
    token, version) pairs (rollout/handoff.py `spans`)."""

    refs: list
    split: list
    n: int
    version: int
    prompts: list
    responses: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    versions: list = field(default_factory=list)
    rollout_idle_s: float = 0.0

    @classmethod
    def batch(cls, prompts: list, responses: list, logprobs: list, versions: list, n: int, version: int) -> Pending:
        """Collected samples put together by the driver (dynamic sampling's kept groups): what
        `keep` takes; `version` the oldest weights among them."""
        return cls([], [], n, version, prompts, responses, logprobs, versions)

    def staleness(self, trainer_version: int) -> dict:
        """rollout/staleness_mean (over the response tokens) and _max: how many versions each
        token's weights are behind `trainer_version`, the weights the update starts from; and
        rollout/partial_frac, the share of responses an update landed in the middle of."""
        behind = total = 0
        worst, partial = 0, 0
        for resp, sp in zip(self.responses, self.versions):
            for i, (start, version) in enumerate(sp):
                end = sp[i + 1][0] if i + 1 < len(sp) else len(resp)
                behind += (trainer_version - version) * (end - start)
                total += end - start
                worst = max(worst, trainer_version - version)
            partial += len(sp) > 1
        return {"rollout/staleness_mean": behind / max(total, 1), "rollout/staleness_max": float(worst),
                "rollout/partial_frac": partial / max(len(self.responses), 1)}


WEIGHTS = "weights"
"""The rollout workers' concurrency group for weight loads, beside their generation's."""


class Cluster:
    split = False  # trainer.placement=split: the rollout workers are a group of their own
    rollout = None  # that group (split placement)

    @property
    def _mid(self) -> bool:
        """Split placement's weights land mid-generation (the engine takes them between tokens)."""
        return self.spec.between_tokens(self.cfg)

    def __init__(self, cfg, model_path: str):
        self.cfg = cfg
        self.spec = get_rollout(cfg.rollout.backend)
        self.owns_ray = start_ray(cfg)
        t = cfg.trainer
        world = t.nnodes * t.workers_per_node
        self.split = t.placement == "split"
        try:
            gpus = cluster_gpus()
            bundle = worker_bundle(gpus, t.cpus_per_worker)
            if self.split:
                check_rollout_fits(cfg, gpus)
            # split: the trainer workers hold no engine, and the engine logs are the rollout workers'
            self.group = WorkerGroup(Worker, cfg, model_path, self.spec, world, bundle,
                                     log_dir=None if self.split else t.output_dir, tp=1 if self.split else None)
        except (ClusterError, ConfigError):
            stop_ray(self.owns_ray)
            raise
        self.workers = self.group.actors
        try:
            if self.split:  # its own placement group, its engines packed on as few nodes as hold them
                r = cfg.rollout
                self.rollout = WorkerGroup(RolloutWorker, cfg, model_path, self.spec,
                                           r.workers * r.tensor_parallel_size, worker_bundle(gpus, cfg.rollout_cpus),
                                           nodes=1, log_dir=t.output_dir, role="rollout worker",
                                           concurrency_groups={WEIGHTS: 1} if self._mid else None)
            self.setup_info = self.group.setup()[0]
            if self.split:
                self.rollout.setup("rollout setup")
                self._join_transport()
            # the workers' config, context override included: checkpoints save it as config.json
            self.hf_config = load_model_config(model_path, cfg.model.max_position_embeddings)
        except BaseException:
            self.shutdown()  # the run ends here: its workers, placement group and Ray with it
            raise
        self.world = world
        self._kept: list[range] | None = None  # each worker's samples of the step's rollout
        self._pending: Pending | None = None  # split placement: the step's kept generation
        self.version = 0  # split placement: the weights' version the rollout workers hold (queued)

    def _join_transport(self) -> None:
        """The weight transport over the trainer's rank 0 and every rollout worker (all join at
        once), then version 0 to the rollout workers: the trainer's weights (its warm start, a
        checkpoint's) are the ones sampled from, not whatever the engines loaded."""
        rollout = self.rollout.actors
        host, port = self.group.gather([self.workers[0].transport_address.remote()], "transport")[0]
        size = 1 + len(rollout)
        opened, _ = WorkerGroup.gather_all(
            [(self.group, [self.workers[0].open_transport.remote(host, port, size)]),
             (self.rollout, [a.join_transport.remote(host, port, 1 + i, size) for i, a in enumerate(rollout)])],
            "transport")
        self._meta, self._dtype, self._shards = opened[0]
        self.publish(0)

    def publish(self, version: int) -> dict:
        """Split placement: the trainer's weights to every rollout worker as `version`, at once
        where its engine takes them between tokens (a generation in flight goes on under them),
        else after whatever generations it has queued; returns its metrics (`publish_metrics`)."""
        t0 = time.perf_counter()
        receive = [(a.receive_weights.options(concurrency_group=WEIGHTS) if self._mid else a.receive_weights).remote(
                   self._meta, self._dtype, version, self._shards) for a in self.rollout.actors]
        sent, _ = WorkerGroup.gather_all(
            [(self.group, [w.publish.remote(self._meta, version) for w in self.workers]), (self.rollout, receive)],
            "weight transport")
        self.version = version
        return publish_metrics(sent, time.perf_counter() - t0)

    def load(self, path: str, step: int) -> None:
        """The checkpoint of step `step` into the trainer's workers (and so into their engines,
        or the rollout workers' in split placement, as version `step`: the weights a resumed
        step `step` + 1 trains from)."""
        self.call("load", path)
        if self.split:
            self.publish(step)

    def call(self, method: str, *args):
        return self.group.call(method, *args)

    def generate_stream(self, prompts: list[list[int]], n: int, temperature: float, top_p: float, stream: int | str,
                        keep: bool = False):
        """Steps 1-2 of the loop's step: n samples per prompt (prompt-major), the prompts shared out
        by `WorkerGroup.shares`: yields (index of the share's first sample, its responses) as each worker
        finishes, so the driver can score one share while the others still generate.
        Sample i of the call is drawn with `sample_seed(trainer.seed, stream, i)`, whichever
        worker draws it. `keep`: the step's training samples; each worker keeps its share for
        `train_step`."""
        if self.split:
            pending = self.submit(prompts, n, temperature, top_p, stream)
            if keep:
                self._pending = pending
            yield from self.collect(pending)
            return
        split = self.group.shares(len(prompts))
        seed = self.cfg.trainer.seed
        # each worker is sent its engine's prompts (every rank of a tensor-parallel engine samples
        # them alike) and told which are its own, which it returns and keeps
        refs = [w.generate.remote([prompts[i] for i in g], n, temperature, top_p,
                                  sample_seeds(seed, stream, g.start * n, len(g) * n),
                                  own=(r.start - g.start, r.stop - g.start), keep=keep)
                for w, (g, r) in zip(self.workers, split)]
        if keep:
            self._kept = [range(r.start * n, r.stop * n) for _, r in split]
        for rank, responses in self.group.as_completed(refs, "generate"):
            yield split[rank][1].start * n, responses

    def _samplers(self) -> WorkerGroup:
        """The workers whose engines sample the policy: the rollout workers in split
        placement, the trainer's own workers colocated."""
        return self.rollout if self.split else self.group

    def submit(self, prompts: list[list[int]], n: int, temperature: float, top_p: float, stream: int | str) -> Pending:
        """Submit a generation (as `generate_stream` shares it out and seeds it) whose responses
        and sampler log-probs come back to the driver, which can send them to `train_step`
        (`keep`): split placement's, and dynamic sampling's rounds (loop.py). In split placement
        it samples the weights of version `self.version`, the last one published before it, or a
        newer one that lands before it starts or mid-generation (partial rollouts; with a
        tensor-parallel vLLM engine a worker runs its loads and generations in order); colocated, the engines' current ones."""
        samplers = self._samplers()
        split = samplers.shares(len(prompts))
        seed = self.cfg.trainer.seed
        refs = [a.sample_timed.remote([prompts[i] for i in g], n, temperature, top_p,
                                      sample_seeds(seed, stream, g.start * n, len(g) * n),
                                      own=(r.start - g.start, r.stop - g.start))
                for a, (g, r) in zip(samplers.actors, split)]
        total = len(prompts) * n
        return Pending(refs, split, n, self.version, prompts, [None] * total, [None] * total, [None] * total)

    def collect(self, pending: Pending):
        """Yield (index of the share's first sample, its responses) of a submitted generation as
        each worker finishes; the log-probs stay in `pending`."""
        for rank, (tokens, logprobs, versions, idle) in self._samplers().as_completed(pending.refs, "generate"):
            start = pending.split[rank][1].start * pending.n
            pending.responses[start:start + len(tokens)] = tokens
            pending.logprobs[start:start + len(tokens)] = logprobs
            pending.versions[start:start + len(tokens)] = versions
            pending.rollout_idle_s = max(pending.rollout_idle_s, idle)
            yield start, tokens

    def keep(self, pending: Pending) -> None:
        """The samples the next `train_step` trains on, sent to the workers with their
        advantages: a collected generation, or a batch of them (`Pending.batch`)."""
        self._pending = pending

    def train_step(self, adv: list[float], step: int) -> dict:
        """Step 4 of the loop's step: each worker trains on the samples it kept from the last
        `generate_stream(keep=True)`; it is sent only their advantages (`adv`: one per sample of
        the step, in order). Split placement, or samples the driver holds (`keep`): each
        trainer worker is sent its share of them too; in split placement the new weights are
        then published as version `step`."""
        if self.split or self._pending is not None:
            return self._train_sent(adv, step)
        kept, self._kept = self._kept, None
        if kept is None or kept[-1].stop != len(adv):
            raise ValueError(f"train_step: {len(adv)} advantages do not match the kept rollout")
        outs = self.group.gather([w.train_step.remote(adv[r.start:r.stop], step) for w, r in zip(self.workers, kept)],
                                 "train_step")
        return merge_updates(outs)

    def _train_sent(self, adv: list[float], step: int) -> dict:
        pending, self._pending = self._pending, None
        if pending is None or len(pending.responses) != len(adv):
            raise ValueError(f"train_step: {len(adv)} advantages do not match the kept rollout")
        n = pending.n
        refs = []
        for w, (_, r) in zip(self.workers, self.group.shares(len(pending.prompts))):
            a, b = r.start * n, r.stop * n
            samples = ([p for p in pending.prompts[r.start:r.stop] for _ in range(n)], pending.responses[a:b],
                       pending.logprobs[a:b])
            refs.append(w.train_step.remote(adv[a:b], step, samples))
        merged = merge_updates(self.group.gather(refs, "train_step"))
        if self.split:
            merged.update(self.publish(step))
        return merged

    def weights_checksums(self) -> tuple[float, list[float]]:
        """Split placement: the trainer's and each rollout worker's transport.py `checksum` of
        the weights (tests)."""
        names = [name for name, _ in self._meta]
        trainer = self.group.gather([w.weights_checksum.remote() for w in self.workers], "checksum")[0]
        return trainer, self.rollout.gather([a.weights_checksum.remote(names) for a in self.rollout.actors],
                                            "checksum")

    def shutdown(self) -> None:
        if self.rollout is not None:
            self.rollout.shutdown()
        self.group.shutdown()
        stop_ray(self.owns_ray)


def publish_metrics(outs: list[dict], wall_s: float) -> dict:
    """A publish's metrics from the trainer workers' `publish` results (rank 0's holds the
    transfer) and its wall time on the driver (`time/sync_s`: with a tensor-parallel vLLM engine
    the rollout workers' wait for an in-flight generation included; else at most one token's or
    engine step's)."""
    return {"time/sync_s": wall_s, **outs[0]}


def merge_updates(outs: list[dict]) -> dict:
    """The step's update metrics from every worker's (worker.py `update_metrics`): the mean over
    workers, the largest peak memory, the skipped updates as counted alike on every worker, and
    the rollout/* metrics over all tokens from the pooled sums."""
    sums = pool_sums(o.pop(ROLLOUT_SUMS) for o in outs)
    merged = {k: sum(o[k] for o in outs) / len(outs) for k in outs[0]}
    merged["memory/peak_gb"] = max(o["memory/peak_gb"] for o in outs)
    merged["train/skipped_updates"] = outs[0]["train/skipped_updates"]
    merged.update(rollout_metrics(sums))
    return merged


def check_rollout_fits(cfg, gpus: int) -> None:
    """Split placement on GPUs: one engine's rollout.tensor_parallel_size workers on one node's
    GPUs, beside nothing else of the run's (the trainer's workers have GPUs of their own).
    On CPU the roles share the node's cores (loop.py logs it)."""
    import ray

    if not gpus:
        return
    tp = cfg.rollout.tensor_parallel_size
    per_node = max(int(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes() if n.get("Alive"))
    if tp > per_node:
        raise ConfigError(f"rollout.tensor_parallel_size={tp} with trainer.placement=split: an engine spans one "
                          f"node, and the largest node has {per_node} GPU(s)")
    need = cfg.rollout.workers * tp + cfg.trainer.nnodes * cfg.trainer.workers_per_node
    if need > gpus:
        raise ConfigError(f"rollout.workers={cfg.rollout.workers} x rollout.tensor_parallel_size={tp} beside "
                          f"{need - cfg.rollout.workers * tp} trainer workers needs {need} GPUs; the Ray cluster "
                          f"has {gpus}")
