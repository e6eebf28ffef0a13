"""The training loop, top to bottom: rollout -> reward -> group advantage -> (on the workers) old
and reference log-probs, mini-batch updates, weight sync -> metrics, checkpoints, validation.

The driver (this process) holds the data and the loop; the reward pool's workers score the
responses (rewards/pool.py); Ray actors (worker.py) hold the FSDP shards and the rollout engines. Each worker generates for its own
share of the prompts and trains on those samples, so only token ids and scalars cross Ray."""

from __future__ import annotations

import math
import os
import random
import time

import torch

from reasonrl_fast.rewards.pool import RewardPool
from reasonrl_fast.rewards.score import load_reward_fn
from reasonrl_fast.trainer import checkpoint as ckpt
from reasonrl_fast.trainer.algos import advantages, overlong_penalty
from reasonrl_fast.trainer.config import to_yaml
from reasonrl_fast.trainer.data import Sampler, load_datasets
from reasonrl_fast.trainer.logger import MetricsLogger
from reasonrl_fast.trainer.model import load_tokenizer
from reasonrl_fast.trainer.sft import warm_start


def run(cfg, log=print) -> dict:
    """Train according to `cfg`; returns the last metrics row. The run directory is locked for
    the whole run: a second trainer on it fails at once instead of interleaving with this one."""
    with ckpt.locked(cfg.trainer.output_dir):
        return _run(cfg, log)


def _run(cfg, log) -> dict:
    t_start = time.time()
    out_dir = cfg.trainer.output_dir
    # Before anything slow: which checkpoint (if any) we continue, checked complete and trusted.
    resume_from, state = ckpt.prepare_run(cfg, warn=log)
    run_id = state["run_id"] if state else ckpt.new_run_id()
    with open(os.path.join(out_dir, "config.yaml"), "w") as f:
        f.write(to_yaml(cfg))

    # Model: a local HF directory, or the embedded tiny model after its (cached) warm start.
    model_path = cfg.model.path or warm_start(cfg, log)
    tok = load_tokenizer(model_path)
    train_set, val_set = load_datasets(cfg, tok)
    load_reward_fn(cfg.data.reward_fn)  # a bad spec fails now, not after the cluster started

    from reasonrl_fast.trainer.cluster import Cluster  # imports ray

    cluster = Cluster(cfg, model_path)
    pool = None
    try:
        r = cfg.reward
        pool = RewardPool(cfg.data.reward_fn, r.num_workers, r.timeout_s, r.backend, r.sandbox_timeout_s)
        sampler = Sampler(len(train_set), cfg.trainer.seed, cfg.data.shuffle)
        start = 0
        if resume_from:
            start = state["step"]
            sampler.load_state(state["sampler"])
            random.setstate(ckpt.as_tuple(state["python_rng"]))
            cluster.call("load", resume_from)
            log(f"resumed from {resume_from} (step {start})")
        logger = MetricsLogger(cfg, out_dir, start, cfg.trainer.steps)
        last: dict = {}
        every = cfg.trainer.val_every
        if val_set and every and start == 0:
            logger.log({"step": 0, **validate(cfg, cluster, tok, val_set, pool, step=0)})

        for step in range(start + 1, cfg.trainer.steps + 1):
            t0 = time.perf_counter()
            items = [train_set[i] for i in sampler.next(cfg.data.prompts_per_step)]
            prompts = [tok(it["prompt"])["input_ids"] for it in items]
            n = cfg.rollout.n

            # 1. rollout: each worker samples n responses for its share of the prompts
            t = time.perf_counter()
            responses = cluster.generate(prompts, n, cfg.rollout.temperature, seed=step)
            t_rollout = time.perf_counter() - t

            # 2. reward: each sample by its data_source's scorer, in the pool; a sample that
            # fails or runs out of time scores 0 and is counted
            t = time.perf_counter()
            texts = tok.batch_decode(responses, skip_special_tokens=True)
            scores, acc, reward_metrics = score_responses(pool, items, texts, n)
            lengths = torch.tensor([len(r) for r in responses])
            rewards = torch.tensor(scores) + overlong_penalty(
                lengths, cfg.rollout.max_new_tokens, cfg.grpo.overlong_buffer, cfg.grpo.overlong_factor)
            t_reward = time.perf_counter() - t

            # 3. group advantage (the group is the prompt)
            group_ids = torch.arange(len(items)).repeat_interleave(n)
            norm = cfg.grpo.norm_by_std if cfg.algo == "grpo" else True
            adv = advantages(rewards, group_ids, norm_by_std=norm)

            # 4-6. old/ref log-probs, mini-batch updates, weight sync (on the workers)
            rep_prompts = [p for p in prompts for _ in range(n)]
            w = cluster.train_step(rep_prompts, responses, adv.tolist(), step)

            t_step = time.perf_counter() - t0
            tokens = sum(len(p) for p in rep_prompts) + int(lengths.sum())
            row = {
                "step": step,
                "reward/mean": float(rewards.mean()),
                "accuracy/mean": sum(acc) / len(acc),
                **reward_metrics,
                "response_length/mean": float(lengths.float().mean()),
                "response_length/clip_frac": float((lengths >= cfg.rollout.max_new_tokens).float().mean()),
                **w,
                "time/rollout_s": t_rollout,
                "time/reward_s": t_reward,
                "time/step_s": t_step,
                "perf/tokens_per_s": tokens / t_step,
            }
            if cfg.trainer.save_every and step % cfg.trainer.save_every == 0 or (
                    cfg.trainer.save_last and step == cfg.trainer.steps):
                save(cfg, cluster, tok, step, sampler, run_id)
            if val_set and every and (step % every == 0 or step == cfg.trainer.steps):
                row.update(validate(cfg, cluster, tok, val_set, pool, step))
            logger.log(row)
            last = row
        logger.close()
        log(f"done in {time.time() - t_start:.0f}s: {_summary(last)}")
        return last
    finally:
        if pool is not None:
            pool.close()
        cluster.shutdown()


def score_responses(pool: RewardPool, items: list[dict], texts: list[str], n: int):
    """Scores of the responses (`n` per item, in order), routed by each item's data_source:
    (rewards with non-finite ones as 0, acc flags, the step's reward/* counters)."""
    samples = [(it.get("data_source", "math"), text, it["answer"], it.get("extra_info"))
               for it, text in zip((it for it in items for _ in range(n)), texts, strict=True)]
    results, metrics = pool.score(samples)
    scores, nonfinite = finite_rewards([r["score"] for r in results])
    return scores, [r["acc"] for r in results], {**metrics, "reward/nonfinite": nonfinite}


def validate(cfg, cluster, tok, val_set, pool, step: int) -> dict:
    """mean@val_n accuracy (from each scorer's `acc`) on the validation prompts at
    rollout.val_temperature."""
    t = time.perf_counter()
    k = cfg.rollout.val_n
    prompts = [tok(it["prompt"])["input_ids"] for it in val_set]
    responses = cluster.generate(prompts, k, cfg.rollout.val_temperature, seed=10**6 + step)
    texts = tok.batch_decode(responses, skip_special_tokens=True)
    _, acc, _ = score_responses(pool, val_set, texts, k)
    return {"val/accuracy": sum(acc) / len(acc), "time/val_s": time.perf_counter() - t}


def finite_rewards(rewards: list[float]) -> tuple[list[float], int]:
    """Non-finite rewards become 0 and are counted (`reward/nonfinite`): one NaN would make the
    group's advantages, hence every update of the step, non-finite, and the step would be lost."""
    out = [r if math.isfinite(r) else 0.0 for r in rewards]
    return out, sum(not math.isfinite(r) for r in rewards)


def save(cfg, cluster, tok, step: int, sampler, run_id: str) -> str:
    tmp = ckpt.tmp_path(cfg.trainer.output_dir, step)
    cluster.call("save", tmp)
    state = {"step": step, "run_id": run_id, "world_size": cluster.world, "sampler": sampler.state(),
             "python_rng": random.getstate()}
    return ckpt.finalize(tmp, state, tok, cluster.hf_config, cfg.trainer.keep_checkpoints)


def _summary(row: dict) -> str:
    keys = ("step", "reward/mean", "accuracy/mean", "val/accuracy", "time/step_s")
    return " ".join(f"{k}={row[k]:.4g}" for k in keys if k in row)
