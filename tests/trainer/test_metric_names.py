"""The metrics contract (docs/trainer.md §Metrics): every name a step can log is `<area>/<name>`
(`step` alone is a row key) and is listed there, and every listed name is logged by one of the
configurations below.

The names come from the trainer's own code, run in one process on the tiny model: the loop's
`_step` and `validate` (trainer/loop.py), each of two workers' real `Worker.train_step` (without
its process group or engine), merged as the cluster merges them, FAPO's judge with its real
GenRM client, and the tasks' validation metrics; the rows go through the real MetricsLogger into
metrics.jsonl. Only the transport is faked: the workers' engine, the reward pool's processes and
the GenRM server's answers."""

import re
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from reasonrl_fast.algos import get_algo
from reasonrl_fast.config import load_config
from reasonrl_fast.genrm.client import Verdict
from reasonrl_fast.models.tiny import char_tokenizer, tiny_model
from reasonrl_fast.runtime.datasets import Sampler
from reasonrl_fast.runtime.datasets import val_set as val_set_of
from reasonrl_fast.tasks import get_task
from reasonrl_fast.trainer import loop
from reasonrl_fast.trainer.logger import MetricsLogger
from reasonrl_fast.trainer.optim import make_optimizer
from reasonrl_fast.trainer.policy import Actor
from reasonrl_fast.trainer.schedule import make_scheduler
from reasonrl_fast.util import read_metrics
from tests.helpers.metric_names import as_documented, documented, problems

TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2", "model.num_heads=2",
        "data.prompts_per_step=4", "optim.mini_batch_prompts=2", "rollout.n=2", "rollout.val_n=2",
        "rollout.max_new_tokens=16", "rollout.sync_every=100", "trainer.val_every=1", "trainer.save_every=0",
        "trainer.progress=false", "trainer.logger=none"]
# together, every optional metric: GRPO's KL, dual clip and rollout correction; FlowRL's TB and
# Z-head; FAPO's judge (its client's counters, the step checker's agreement)
CONFIGS = {"grpo": ["algo=grpo", "grpo.kl_coef=0.1", "grpo.clip_ratio_c=3.0", "rollout.correction=token_tis"],
           "flowrl": ["algo=flowrl"],
           "fapo": ["algo=fapo", "fapo.genrm.addresses=[127.0.0.1:9]"],
           # split placement's staleness and idle times (its generation submitted ahead)
           "split": ["algo=grpo", "trainer.placement=split", "trainer.max_staleness=1", "rollout.sync_every=1"],
           # dynamic sampling's rounds (every group of `_answer` is mixed: one round)
           "dynamic": ["algo=grpo", "data.filter_groups=acc", "data.gen_prompts_per_step=6"],
           # validation by sets, each with its own metrics
           "val_sets": ["algo=grpo", "data.val_sets=[{name: a, n: 2}, {name: b, n: 3, k: [1, 3], maj: true}]"],
           # multi-turn rollouts' tool metrics (each worker's share also run through the real
           # turns with a calculator call, `FakeWorkers.turns`)
           "tools": ["algo=grpo", "rollout.tools=[calculator]"]}


def test_the_contract_refuses_bare_and_undocumented_names():
    listed = {"train/loss", "val/pass@<k>"}
    assert problems({"step", "train/loss", "val/pass@4"}, listed) == []
    assert problems({"loss"}, listed) == ["'loss' is not <area>/<name>"]
    assert problems({"train/new"}, listed) == ["'train/new' is not in docs/trainer.md §Metrics"]


def _answer(prompt: str, i: int) -> str:
    """A sample's text: for an addition prompt the right sum on even samples, a wrong one on odd
    ones; for a GenRM prompt the verdict 'no wrong step'."""
    m = re.fullmatch(r"(\d+)\+(\d+)=", prompt)
    if m is None:
        return "\\boxed{-1}"
    a, b = int(m[1]), int(m[2])
    return f"{a % 10}+{b % 10}={a % 10 + b % 10} \\boxed{{{a + b + i % 2}}}"


class FakeWorkers:
    """The cluster's interface on two in-process workers: sampling answers by `_answer`, and
    each worker's real `train_step` on the samples it kept, merged as cluster.py merges them."""

    def __init__(self, cfg, tok):
        from reasonrl_fast.trainer.worker import Worker

        self.cfg, self.tok, self.world = cfg, tok, 2
        algo = get_algo(cfg.algo)
        self.workers = []
        for rank in range(self.world):
            w = Worker.__new__(Worker)
            lm = tiny_model(cfg.model, len(tok), tok)
            w.cfg, w.rank, w.world, w.tok, w.algo, w.device = cfg, rank, 1, tok, algo, torch.device("cpu")
            w.layout = SimpleNamespace(packed=False, one_row=False, sharding="replicate", rollout_dtype="float32",
                                       sequence_parallel=1)
            w.engine = SimpleNamespace(sleep=lambda: None, wake=lambda: None)
            w.split = cfg.trainer.placement == "split"  # as its setup sets it: publish, not sync, after the update
            w.actor = w.train_model = Actor(lm, cfg.flowrl.zhead_layers if algo.zhead else 0)
            w.ref = Actor(tiny_model(cfg.model, len(tok), tok)).eval() if algo.needs_ref(cfg) else None
            w.opt = make_optimizer([{"params": list(w.actor.parameters()), "lr": cfg.optim.lr}], cfg, w.device)
            w.sched = make_scheduler(w.opt, cfg.optim.warmup_steps)
            self.workers.append(w)
        self._kept = None
        self.split, self.version = cfg.trainer.placement == "split", 0
        if self.split:  # the real publish, through a transport with no receiver (rank 0 of 1)
            from reasonrl_fast.rollout.transport import Transport
            from reasonrl_fast.runtime.distributed import rendezvous_socket

            listen = rendezvous_socket("127.0.0.1")
            w = self.workers[0]
            w.transport = Transport("127.0.0.1", listen.getsockname()[1], 0, 1, 60, listen)
            self._meta = [(n, tuple(p.shape)) for n, p in w._full_weights()]

    def submit(self, prompts, n, temperature, top_p, stream):
        from reasonrl_fast.trainer.cluster import Pending

        return Pending([], [], n, self.version, prompts)

    def collect(self, pending):
        """As cluster.py's: the samples stay in `pending` (the loop may collect the next step's
        generation while this one's update runs) until `keep`."""
        pending.kept, pending.responses, pending.logprobs = [], [], []
        for _, start, samples in self._shares(pending.prompts, pending.n):
            pending.kept.append(samples)
            pending.responses += samples[1]
            pending.logprobs += samples[2]
            pending.versions += [[(0, pending.version)] for _ in samples[1]]
            yield start, samples[1]

    def keep(self, pending):
        """A collected generation's samples, or a batch the driver put together (cluster.py
        `Pending.batch`), shared out by halves."""
        kept = getattr(pending, "kept", None)
        if kept is None:
            n, half = pending.n, len(pending.prompts) // 2
            ps = [p for p in pending.prompts for _ in range(n)]
            kept = [(ps[a:b], pending.responses[a:b], pending.logprobs[a:b])
                    for a, b in ((0, half * n), (half * n, len(ps)))]
        for w, samples in zip(self.workers, kept, strict=True):
            w._samples = samples

    def generate_stream(self, prompts, n, temperature, top_p, stream, keep=False):
        for w, start, samples in self._shares(prompts, n):
            if keep:
                w._samples = samples
                if self.cfg.rollout.tools:
                    w._turn_metrics = self.turns(samples[0])
            yield start, samples[1]

    def turns(self, prompts) -> dict:
        """The multi-turn metrics of `prompts` (rollout/turns.py), through the real tool box: an
        engine that calls the calculator in its first turn and answers in its second."""
        from reasonrl_fast.rollout.base import Samples
        from reasonrl_fast.rollout.turns import multi_turn
        from reasonrl_fast.tools.box import ToolBox
        from reasonrl_fast.tools.calls import FORMATS

        def generate(contexts, n, temperature, top_p, limits, seeds, stop=None):
            texts = ["\\boxed{2}" if "</result>" in self.tok.decode(c) else "<calculator>1+1</calculator>"
                     for c in contexts]
            ids = [self.tok(t)["input_ids"] for t in texts]
            return Samples(ids, [[-0.5] * len(i) for i in ids])

        with ToolBox(self.cfg.rollout.tools) as box:
            return multi_turn(generate, prompts, 1, 1.0, 1.0, [64] * len(prompts), list(range(len(prompts))), box,
                              FORMATS["plain"], self.tok, self.cfg.rollout.max_turns).metrics

    def _shares(self, prompts, n):
        """(worker, index of its share's first sample, (prompts, responses, log-probs)) per worker."""
        texts = [self.tok.decode(p, skip_special_tokens=True) for p in prompts]
        half = len(prompts) // 2
        for w, share in zip(self.workers, (range(0, half), range(half, len(prompts)))):
            ps = [prompts[i] for i in share for _ in range(n)]
            rs = [self.tok(_answer(texts[i], j))["input_ids"] + [self.tok.eos_token_id] for i in share for j in range(n)]
            yield w, share.start * n, (ps, rs, [[-0.5] * len(r) for r in rs])

    def train_step(self, adv, step):
        from reasonrl_fast.trainer.cluster import merge_updates, publish_metrics

        half = len(adv) // 2
        self.version = step
        merged = merge_updates([w.train_step(a, step) for w, a in zip(self.workers, (adv[:half], adv[half:]))])
        if self.split:  # as cluster.py's: the update's weights published
            merged.update(publish_metrics([self.workers[0].publish(self._meta, step)], 0.0))
        return merged


class FakePool:
    """The reward pool's interface, scoring in-process: right when the last box holds the answer."""

    last_latencies: list[float] = []

    def score(self, samples):
        results = [{"score": float(acc), "acc": acc}
                   for acc in (text.endswith(f"\\boxed{{{truth}}}") for _, text, truth, _ in samples)]
        self.last_latencies = [0.01] * len(samples)
        return results, {"reward/timeouts": 0, "reward/errors": 0}


def _done(verdict: Verdict) -> Future:
    f = Future()
    f.set_result(verdict)
    return f


def logged_names(overrides: list[str], tmp_path: Path) -> set[str]:
    """Every key of the metrics.jsonl of one step of `overrides`, with validation before and after."""
    from reasonrl_fast.trainer.fapo import Judge

    cfg = load_config(None, [*TINY, *overrides, f"trainer.output_dir={tmp_path}"])
    torch.manual_seed(0)
    tok = char_tokenizer()
    train_set = get_task("addition").split(cfg.data, 4, 0)
    records = train_set[:2] + get_task("genrm").split(cfg.data, 4, 1) + get_task("multiply").split(cfg.data, 4, 2)
    val_set = [val_set_of(cfg, records, v) for v in cfg.data.val_sets] or [val_set_of(cfg, records)]
    algo = get_algo(cfg.algo)
    judge = None
    if algo.uses_genrm:  # the real judge and client; the server's answers: "no wrong step"
        judge = Judge(cfg, log=lambda _: None)
        judge.client.submit = lambda *a, **k: _done(Verdict(step=-1, attempts=1, latency_s=0.01))
    logger = MetricsLogger(cfg, str(tmp_path), 0, 1)
    run = loop.Run(cfg, "run", 0, tok, train_set, val_set, algo, judge, FakeWorkers(cfg, tok), FakePool(),
                   Sampler(len(train_set), 0), logger)
    try:
        logger.log({"step": 0, **loop.validate(cfg, run.cluster, tok, val_set, run.pool, step=0)})
        loop._step(run, 1)
    finally:
        logger.close()
        if judge is not None:
            judge.close()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1]
    return set().union(*rows)


@pytest.fixture(scope="module")
def names(tmp_path_factory) -> dict[str, set[str]]:
    return {k: logged_names(v, tmp_path_factory.mktemp(k)) for k, v in CONFIGS.items()}


def test_every_logged_metric_is_area_slash_name_and_documented(names):
    listed = documented()
    for config, logged in names.items():
        assert problems(logged, listed) == [], config


def test_every_documented_metric_is_logged(names):
    logged = {as_documented(n) for v in names.values() for n in v}
    assert documented() - logged == set()
    # the optional ones really came from the configurations that ask for them
    assert {"kl/mean", "grpo/dual_clip_frac", "rollout/is_weight_mean"} <= names["grpo"]
    assert {"log_z/mean", "tb/delta_abs_mean"} <= names["flowrl"] and "grpo/clip_frac" not in names["flowrl"]
    assert {"fapo/sent", "genrm/requests", "genrm/checker_agreement"} <= names["fapo"]
    split = {"rollout/staleness_mean", "rollout/staleness_max", "rollout/partial_frac", "time/trainer_idle_s",
             "time/rollout_idle_s",
             "time/transport_s", "perf/sync_gb"}
    assert split <= names["split"] and not split & names["grpo"]
    tools = {"rollout/turns_mean", "rollout/policy_token_frac", "tool/calls_per_sample", "tool/error_frac",
             "tool/timeout_frac", "tool/seconds_mean"}
    assert tools <= names["tools"] and not tools & names["grpo"]
