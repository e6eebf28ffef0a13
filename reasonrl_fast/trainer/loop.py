"""The training loop, top to bottom: `_run` starts what the run needs (`_started`), then runs the
numbered step (`_step`): 1. rollout -> 2. reward -> 3. shaped rewards and group advantage -> 4. (on
the workers) reference and old log-probs, mini-batch updates, weight sync -> 5. metrics,
checkpoint, validation.

The driver (this process) holds the data and the loop; the reward pool's workers score the
responses (rewards/pool.py), and for FAPO a GenRM server judges the correct ones (fapo.py); Ray
actors (worker.py) hold the FSDP shards and the rollout engines. Each worker generates for its
own share of the prompts and trains on those samples, so only token ids and scalars cross Ray.
In split placement (trainer.placement=split, cluster.py) rollout workers of their own sample:
the driver submits each step's generation ahead (`_generation`), up to trainer.max_staleness
steps before the update that trains on it, scores the next one beside the update (`_score_ahead`)
and sends the trainer its samples."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from reasonrl_fast.algos import advantages, get_algo
from reasonrl_fast.config import to_yaml
from reasonrl_fast.data.records import encode_prompts
from reasonrl_fast.eval.metrics import PromptResult, answer_key, summarize
from reasonrl_fast.eval.vote import majority
from reasonrl_fast.models.loading import load_tokenizer
from reasonrl_fast.rewards.math import extract_boxed
from reasonrl_fast.rewards.pool import RewardPool
from reasonrl_fast.rewards.score import scorer_for, scorer_kinds
from reasonrl_fast.rollout import get_rollout
from reasonrl_fast.runtime import checkpoint as ckpt
from reasonrl_fast.runtime import resume
from reasonrl_fast.runtime.datasets import Sampler, ValSet, load_datasets
from reasonrl_fast.tasks import all_tasks
from reasonrl_fast.trainer import dynamic
from reasonrl_fast.trainer.logger import MetricsLogger
from reasonrl_fast.trainer.scoring import finite_rewards, rollout_and_score  # noqa: F401 - loop's API
from reasonrl_fast.trainer.sft import warm_start


def run(cfg, log=print) -> dict:
    """Train according to `cfg`; returns the last metrics row. The run directory is locked for
    the whole run: a second trainer on it fails at once instead of interleaving with this one."""
    with ckpt.locked(cfg.trainer.output_dir):
        return _run(cfg, log)


def _run(cfg, log) -> dict:
    t_start = time.time()
    last: dict = {}
    with _started(cfg, log) as run:
        every = cfg.trainer.val_every
        if run.val_sets and every and run.start == 0:
            run.logger.log({"step": 0, **validate(cfg, run.cluster, run.tok, run.val_sets, run.pool, step=0)})
        for step in range(run.start + 1, cfg.trainer.steps + 1):
            last = _step(run, step)
        run.logger.close()
    log(f"done in {time.time() - t_start:.0f}s: {_summary(last)}")
    return last


def _step(run: Run, step: int) -> dict:
    """One training step (the numbering of docs/trainer.md, cluster.py and worker.py); returns its
    metrics row."""
    cfg, algo, n = run.cfg, run.algo, run.cfg.rollout.n
    t0 = time.perf_counter()
    # 1. rollout: the step's prompts; each worker samples n responses for its share of them and
    #    keeps them (with the sampler's log-probs) for the update
    # 2. reward: each worker's share is scored in the reward pool as soon as it arrives (a sample
    #    that fails or runs out of time scores 0 and is counted) and, for FAPO, its right answers
    #    go to the GenRM while the other workers still generate
    items, roll, kept, async_metrics = _rollout(run, step)
    responses, acc = roll["responses"], roll["acc"]
    flagged, genrm_metrics = None, {}
    if run.judge is not None:  # the GenRM's flags on right answers (FAPO)
        verdicts, genrm_metrics = run.judge.collect()
        flagged = [i in verdicts and verdicts[i].flawed for i in roll.get("judge_index", range(len(acc)))]
    # 3. the algorithm's rewards (its own shaping included) and the group advantage (the group is
    #    the prompt)
    lengths = torch.tensor([len(r) for r in responses])
    rewards = algo.rewards(cfg, roll["scores"], acc, flagged, lengths)
    group_ids = torch.arange(len(items)).repeat_interleave(n)
    adv = advantages(rewards, group_ids, norm_by_std=algo.norm_by_std(cfg))
    # 4. on the workers, each on the samples it kept (they are sent only the advantages):
    #    reference and old log-probs, mini-batch updates, weight sync
    #    (split placement: sent their samples too; the weights published to the rollout workers)
    if kept is not None:
        run.cluster.keep(kept)
    if run.cluster.split:
        async_metrics["time/rollout_idle_s"] = kept.rollout_idle_s  # known once collected
        async_metrics["time/trainer_idle_s"] = time.perf_counter() - (run.trained_at or t0)
        _score_ahead(run)
    w = run.cluster.train_step(adv.tolist(), step)
    run.trained_at = time.perf_counter()
    # 5. the metrics row, a checkpoint, validation
    t_step = time.perf_counter() - t0
    tokens = n * sum(len(p) for p in roll["prompts"]) + int(lengths.sum())
    # each response's own length limit (rollout.max_sequence_tokens: what its prompt leaves)
    limits = torch.tensor([cfg.response_limit(len(p)) for p in roll["prompts"] for _ in range(n)])
    row = {
        "step": step,
        "reward/mean": float(rewards.mean()),
        "accuracy/mean": sum(acc) / len(acc),
        **roll["metrics"],
        **genrm_metrics,
        "response_length/mean": float(lengths.float().mean()),
        "response_length/clip_frac": float((lengths >= limits).float().mean()),
        **w,
        **async_metrics,
        "time/rollout_s": roll["time/rollout_s"],
        "time/reward_s": roll["time/reward_s"],
        "time/step_s": t_step,
        "perf/tokens_per_s": tokens / t_step,
    }
    t = cfg.trainer
    if t.save_every and step % t.save_every == 0 or (t.save_last and step == t.steps):
        save(cfg, run.cluster, run.tok, step, _sampler_at(run), run.run_id)
    if run.val_sets and t.val_every and (step % t.val_every == 0 or step == t.steps):
        if run.scoring is not None:  # one user of the reward pool at a time (its error is the next step's)
            run.scoring[1].exception()
        row.update(validate(cfg, run.cluster, run.tok, run.val_sets, run.pool, step))
    run.logger.log(row)
    return row


def _rollout(run: Run, step: int) -> tuple:
    """Steps 1-2 of `_step`: (the step's records, their scored rollout, the samples the driver
    sends the trainer (None: each worker kept its own share), the metrics of how they were made).
    Split placement: the rollout workers' generation for this step, submitted up to
    trainer.max_staleness steps ago (`_generation`) and, with generations in flight, scored beside
    the last update (`_score_ahead`). Dynamic sampling (data.filter_groups): in rounds, until the
    step's groups are kept (trainer/dynamic.py)."""
    cfg = run.cfg
    pending = _generation(run, step) if run.cluster.split else None
    items, kept = pending or (None, None)
    filtering = cfg.data.filter_groups is not None
    roll = None
    if run.scoring is not None and run.scoring[0] == step:
        roll, run.scoring = run.scoring[1].result(), None
    elif pending or not filtering:  # (dynamic sampling's rounds generate and score their own)
        if items is None:
            items = [run.train_set[i] for i in run.sampler.next(cfg.data.prompts_per_step)]
        roll = rollout_and_score(run.cluster, run.pool, run.tok, items, cfg.rollout.n, cfg.rollout.temperature,
                                 cfg.rollout.top_p, step, run.judge, keep=True, pending=kept,
                                 spread=cfg.data.filter_groups)
    if filtering:  # the kept groups of as many rounds as it takes
        first = dynamic.Round(items, roll, kept, 0) if pending else None
        return dynamic.fill_batch(run, step, first)
    # split placement: the versions of its tokens (the trainer holds version step - 1)
    return items, roll, kept, kept.staleness(step - 1) if kept is not None else {}


def _generation(run: Run, step: int) -> tuple:
    """Split placement: submit the generations of the steps up to `step` + max_staleness (not
    past the last step) that are not in flight yet, each on the weights published last (or
    later ones: an update can land before it starts or mid-generation), so every token it samples
    is of the version of the update before `step` or later, at most max_staleness versions behind
    the one `step` trains from; then take `step`'s: its (records, cluster.Pending)."""
    cfg = run.cfg
    last = min(step + cfg.trainer.max_staleness, cfg.trainer.steps)
    while run.submitted < last:
        run.submitted += 1
        before = run.sampler.state()  # what a checkpoint of the step before records (`_sampler_at`)
        items = [run.train_set[i] for i in run.sampler.next(cfg.data.gen_prompts())]
        prompts = encode_prompts(items, run.tok)
        run.in_flight.append((run.submitted, items, run.cluster.submit(prompts, cfg.rollout.n, cfg.rollout.temperature,
                                                                    cfg.rollout.top_p, run.submitted), before))
    submitted, items, pending, _ = run.in_flight.popleft()
    assert submitted == step, (submitted, step)
    staleness = (step - 1) - pending.version  # the trainer holds version step - 1
    if staleness > cfg.trainer.max_staleness:  # the submission order above rules it out
        raise RuntimeError(f"step {step} would train on samples {staleness} versions old")
    return items, pending


def _score_ahead(run: Run) -> None:
    """Split placement, a generation in flight (max_staleness >= 1): collect and score the next
    step's generation in a thread of the driver while the trainer updates, so that a reward's or
    the GenRM's wait overlaps the update instead of adding to the step. One scoring at a time,
    started after this step's judge verdicts were collected: the reward pool and the judge see
    one step after another, as in the synchronous loop."""
    if not run.in_flight or run.scoring is not None:
        return
    cfg = run.cfg
    step, items, pending, _ = run.in_flight[0]
    done: Future = Future()

    def score() -> None:
        try:
            done.set_result(rollout_and_score(run.cluster, run.pool, run.tok, items, cfg.rollout.n,
                                              cfg.rollout.temperature, cfg.rollout.top_p, step, run.judge,
                                              keep=True, pending=pending, spread=cfg.data.filter_groups))
        except BaseException as e:  # noqa: BLE001 - raised where the step takes it
            done.set_exception(e)

    # a daemon: a run that fails or is interrupted mid-update does not wait for it (the cluster's
    # shutdown ends the calls it waits on)
    threading.Thread(target=score, name=f"score-step-{step}", daemon=True).start()
    run.scoring = (step, done)


def _sampler_at(run: Run) -> Sampler:
    """The sampler as of the step just done: the prompts of the generations still in flight
    (split placement) are drawn again by a run resumed from its checkpoint (sampled then by the
    checkpoint's weights, not by the older ones that sampled them here)."""
    if not run.in_flight:
        return run.sampler
    at = Sampler(run.sampler.size, run.sampler.seed, run.sampler.shuffle)
    at.load_state(run.in_flight[0][3])
    return at


@dataclass
class Run:
    """What the steps run on, started by `_started`."""

    cfg: Any
    run_id: str
    start: int  # the last step done (the checkpoint's, or 0)
    tok: Any
    train_set: list
    val_sets: list[ValSet]
    algo: Any
    judge: Any  # FAPO's GenRM judge (trainer/fapo.py), or None
    cluster: Any
    pool: RewardPool
    sampler: Sampler
    logger: MetricsLogger
    # split placement: the generations submitted ahead, (step, records, cluster.Pending), the
    # last step submitted, and when the trainer's last update ended
    in_flight: deque = field(default_factory=deque)
    submitted: int = 0
    trained_at: float | None = None
    scoring: tuple[int, Future] | None = None  # (step, its scored rollout), `_score_ahead`


@contextmanager
def _started(cfg, log):
    """Start what the run needs, in the order that fails cheapest first; release all of it (also
    what started before a failure) on the way out. The checks that need neither the warm-started
    model nor the run directory's checkpoints (the model's context, the fused head, the engine's
    install, the data files, ...) ran before, in preflight.py."""
    out_dir = cfg.trainer.output_dir
    # which checkpoint (if any) the run continues, checked complete and trusted
    resume_from, state = ckpt.prepare_run(cfg, warn=log)
    with open(os.path.join(out_dir, "config.yaml"), "w") as f:
        f.write(to_yaml(cfg))
    # the model: a local HF directory, or the embedded tiny model after its (cached) warm start
    model_path = warm_start(cfg, log) if cfg.embedded_model else cfg.model.path
    tok = load_tokenizer(model_path)
    train_set, val_sets = load_datasets(cfg, tok)
    spec = get_rollout(cfg.rollout.backend)
    engine_line = spec.describe(cfg, out_dir, spec.preflight())  # checked by the preflight: its log line
    if engine_line:
        log(engine_line)

    from reasonrl_fast.trainer.cluster import Cluster  # imports ray

    with ExitStack() as stack:
        # FAPO's judge first: a GenRM that cannot start fails the run before the cluster starts
        algo, judge = get_algo(cfg.algo), None
        if algo.uses_genrm:
            from reasonrl_fast.trainer.fapo import Judge

            judge = Judge(cfg, log)
            stack.callback(judge.close)
        cluster = Cluster(cfg, model_path)
        stack.callback(cluster.shutdown)
        _log_layout(cfg, cluster.setup_info["layout"], log)
        r = cfg.reward
        pool = RewardPool(cfg.data.reward_fn, r.num_workers, r.timeout_s, r.backend, r.sandbox_timeout_s,
                          kinds=_scorer_kinds(train_set, val_sets))
        stack.callback(pool.close)
        sampler = Sampler(len(train_set), cfg.trainer.seed, cfg.data.shuffle)
        start = 0
        if resume_from:
            start = state.step
            state.restore(sampler)
            cluster.load(resume_from, start)
            log(f"resumed from {resume_from} (step {start})")
        yield Run(cfg, state.run_id if state else ckpt.new_run_id(), start, tok, train_set, val_sets, algo, judge,
                  cluster, pool, sampler, MetricsLogger(cfg, out_dir, start, cfg.trainer.steps), submitted=start)


def _scorer_kinds(train_set: list, val_sets: list[ValSet]) -> set[str]:
    """The scorer kinds the run's samples are scored by: their records' data_sources, and each
    validation set's `score_as` where it has one (trainer/scoring.py `_samples`)."""
    sources = {r.get("data_source", "math") for r in train_set}
    for vs in val_sets:
        sources |= {vs.score_as} if vs.score_as else {r.get("data_source", "math") for r in vs.records}
    return scorer_kinds(sources)


def _log_layout(cfg, layout: dict, log) -> None:
    """The workers' Layout (layout/): its notes in the log, the whole of it in the run
    directory (layout.json, which `python -m reasonrl_fast.plan` answers for the same config)."""
    with open(os.path.join(cfg.trainer.output_dir, "layout.json"), "w") as f:
        json.dump(layout, f, indent=1)
    notes = layout["notes"]
    log(notes["lm_head"])
    log(notes["attention"])
    log(f"{notes['packing']}; micro-batches: "
        + (f"at most {cfg.optim.micro_batch_tokens} tokens per forward" if cfg.optim.micro_batch_tokens
           else "one per mini-batch (optim.micro_batch_tokens=0)")
        + ("; activation checkpointing on" if cfg.model.gradient_checkpointing else ""))
    log(notes["sharding"])
    from reasonrl_fast.runtime.ray_cluster import oversubscribed  # imports ray, as the cluster did

    shared = oversubscribed(cfg)
    if shared:
        log(shared)
    t = cfg.trainer
    if t.placement == "split":
        r = cfg.rollout
        cpu = (f" (on CPU: {t.cpus_per_worker} and {cfg.rollout_cpus} thread(s) a worker; the two roles share the "
               f"node's cores)" if layout.get("device") == "cpu" else "")
        log(f"placement: split, {t.nnodes * t.workers_per_node} trainer worker(s) and {r.workers} rollout engine(s) "
            f"of {r.tensor_parallel_size} worker(s){cpu}; samples at most {t.max_staleness} version(s) stale"
            + ("; rollout.correction=none: the update does not weigh their gap to the trainer's weights "
               "(token_tis does: docs/trainer.md §Placement)" if t.max_staleness and r.correction == "none" else ""))


def validate(cfg, cluster, tok, val_sets: list[ValSet], pool, step: int) -> dict:
    """Each validation set's prompts, `n` samples each at its temperature and top-p (not
    training's), scored by each record's scorer (`acc`): docs/trainer.md §Validation. The one set
    of data.val_files (or the embedded split) logs val/accuracy (mean@n) and, with n > 1,
    val/pass@n, distinct@n and entropy@n; the sets of data.val_sets log val/<name>/mean@<n>,
    pass@<k> and maj@<n>, and val/accuracy as their macro average, as the papers quote it. Each
    embedded task's own metrics are on all sets' records (the addition task's
    val/flawed_positive_ratio, the GenRM task's accuracy on flawless and flawed solutions)."""
    t = time.perf_counter()
    row: dict = {}
    items, texts, acc, means = [], [], [], []
    for vs in val_sets:
        n = vs.n
        roll = rollout_and_score(cluster, pool, tok, vs.records, n, vs.temperature, vs.top_p,
                                 f"val/{step}/{vs.name}" if vs.name else f"val/{step}", score_as=vs.score_as)
        mean = sum(roll["acc"]) / len(roll["acc"])
        if vs.name:
            means.append(mean)
            row.update(set_metrics(vs, roll["texts"], roll["acc"]))
        else:
            row["val/accuracy"] = mean
            if n > 1:
                row.update(diversity(vs.records, roll["texts"], roll["acc"], n))
        items += [vs.records[i // n] for i in range(len(roll["acc"]))]
        texts += roll["texts"]
        acc += roll["acc"]
    if means:
        row["val/accuracy"] = sum(means) / len(means)
    for task in all_tasks():  # each embedded task's metrics on its own records
        row.update(task.val_metrics(items, texts, acc))
    row["time/val_s"] = time.perf_counter() - t
    return row


def set_metrics(vs: ValSet, texts: list[str], acc: list[bool]) -> dict:
    """val/<name>/mean@<n>, pass@<k> for its ks and maj@<n> where asked, over one named set's
    prompts (`texts`, `acc`: their samples, prompt-major): eval's summary over all its prompts
    (`summarize`'s overall_micro), so that the eval command reports the same numbers."""
    n = vs.n
    results = []
    for i, rec in enumerate(vs.records):
        sl = slice(i * n, (i + 1) * n)
        maj = majority(rec, [extract_boxed(t) for t in texts[sl]]) if vs.maj else None
        results.append(PromptResult(rec.get("data_source", ""), acc[sl], [], maj))
    m = summarize(results, n, vs.ks)["overall_micro"]
    keys = [f"mean@{n}", *(f"pass@{k}" for k in vs.ks), *([f"maj@{n}"] if vs.maj else [])]
    return {f"val/{vs.name}/{k}": float("nan") if m[k] is None else m[k] for k in keys}


def diversity(records: list[dict], texts: list[str], acc: list[bool], k: int) -> dict:
    """val/pass@k, val/distinct@k and val/entropy@k over the validation prompts' k samples each:
    eval's own summary (eval/metrics.py), averaged over all prompts (the entropy over those with
    a right sample, 0 when none has one)."""
    results = []
    for i, rec in enumerate(records):
        sl = slice(i * k, (i + 1) * k)
        code = scorer_for(rec.get("data_source", "")) == "code"
        results.append(PromptResult(rec.get("data_source", ""), acc[sl], [], None,
                                    [answer_key(t, whole=code) for t in texts[sl]]))
    m = summarize(results, k, [k])["overall_micro"]
    return {f"val/pass@{k}": m[f"pass@{k}"], f"val/distinct@{k}": m[f"distinct@{k}"],
            f"val/entropy@{k}": m[f"entropy@{k}"] or 0.0}


def save(cfg, cluster, tok, step: int, sampler, run_id: str) -> str:
    tmp = ckpt.tmp_path(cfg.trainer.output_dir, step)
    cluster.call("save", tmp)  # the workers' shards and RNG files
    # the driver's part, with the run's settings that a resumed run compares its own with
    state = ckpt.TrainState.now(step, run_id, cluster.world, sampler, resume.settings(cfg))
    return ckpt.finalize(tmp, state, tok, cluster.hf_config, cfg.trainer.keep_checkpoints)


def _summary(row: dict) -> str:
    keys = ("step", "reward/mean", "accuracy/mean", "val/accuracy", "time/step_s")
    return " ".join(f"{k}={row[k]:.4g}" for k in keys if k in row)
