"""Steps 1-2 of the loop's step, for training and validation alike: generate a batch's responses
and score each worker's share as soon as it arrives (`rollout_and_score`), FAPO's right answers
sent to the GenRM judge on the way."""

from __future__ import annotations

import math
import time

from reasonrl_fast.algos import groups_with_spread
from reasonrl_fast.data.records import encode_prompts
from reasonrl_fast.rewards.pool import RewardPool
from reasonrl_fast.util import quantile

REWARD_COUNTS = ("reward/timeouts", "reward/errors")


def rollout_and_score(cluster, pool: RewardPool, tok, items: list[dict], n: int, temperature: float,
                      top_p: float, stream: int | str, judge=None, keep: bool = False, pending=None,
                      spread: str | None = None, index_base: int = 0, score_as: str | None = None) -> dict:
    """Generate `n` responses per item at `temperature` and `top_p` (sample seeds from `stream`:
    the step, or a validation pass) and score each worker's share as soon as it arrives
    (for FAPO, also submit its correct responses to the judge, as sample `index_base` + i);
    `keep`: the workers keep their samples for the step's update. Returns the prompts' ids, the
    responses (ids and text), scores (non-finite as 0), acc flags, reward/* metrics (and their
    parts: `counts`, `latencies`), and time/rollout_s (until the last share arrived) and
    time/reward_s (the driver's scoring).
    `pending`: a generation of `items` submitted before (cluster.py `submit`), collected here
    instead of a new one. `spread`: dynamic sampling's filter (data.filter_groups, acc or score):
    `kept` holds each group's verdict (`groups_with_spread`), and only a kept group's right
    answers go to the judge (a dropped group's would be judged for nothing). `score_as`: the
    data_source every response is scored as (a validation set's scorer), else its record's."""
    t0 = time.perf_counter()
    prompts = pending.prompts if pending is not None else encode_prompts(items, tok)
    total = len(items) * n
    responses: list = [None] * total
    texts: list = [None] * total
    scores, acc = [0.0] * total, [False] * total
    kept: list = [None] * len(items)
    latencies: list[float] = []
    counts = dict.fromkeys(REWARD_COUNTS, 0)
    t_rollout = t_reward = 0.0
    shares = (cluster.collect(pending) if pending is not None
              else cluster.generate_stream(prompts, n, temperature, top_p, stream, keep=keep))
    for start, shard in shares:
        t = time.perf_counter()
        t_rollout = t - t0
        idx = range(start, start + len(shard))
        shard_texts = tok.batch_decode(shard, skip_special_tokens=True)
        results, m = pool.score(_samples([items[i // n] for i in idx], shard_texts, score_as))
        latencies += pool.last_latencies
        for k in counts:
            counts[k] += m[k]
        for i, ids, text, r in zip(idx, shard, shard_texts, results):
            responses[i], texts[i], scores[i], acc[i] = ids, text, r["score"], r["acc"]
        if spread is not None:  # a share holds whole groups (the workers' shares are of prompts)
            values = finite_rewards(scores[idx.start:idx.stop])[0] if spread == "score" else acc[idx.start:idx.stop]
            kept[start // n:(start + len(shard)) // n] = groups_with_spread(values, n)
        if judge is not None:
            for i in idx:
                if acc[i] and (spread is None or kept[i // n]):
                    judge.submit(index_base + i, items[i // n], texts[i])
        t_reward += time.perf_counter() - t
    scores, nonfinite = finite_rewards(scores)
    return {"prompts": prompts, "responses": responses, "texts": texts, "scores": scores, "acc": acc,
            "kept": kept if spread is not None else None, "counts": counts, "latencies": latencies,
            "nonfinite": nonfinite, "metrics": reward_metrics(counts, latencies, nonfinite),
            "time/rollout_s": t_rollout, "time/reward_s": t_reward}


def reward_metrics(counts: dict, latencies: list[float], nonfinite: int) -> dict:
    """The reward/* metrics of one or more scored batches (docs/trainer.md §Metrics)."""
    return {**counts, "reward/latency_p50_s": quantile(latencies, 0.5),
            "reward/latency_p99_s": quantile(latencies, 0.99), "reward/nonfinite": nonfinite}


def _samples(items: list[dict], texts: list[str], score_as: str | None = None) -> list[tuple]:
    """The reward pool's (data_source, response, ground truth, extra_info) per response; `items`
    holds each response's record; `score_as` replaces every data_source."""
    return [(score_as or it.get("data_source", "math"), text, it["answer"], it.get("extra_info"))
            for it, text in zip(items, texts, strict=True)]


def finite_rewards(rewards: list[float]) -> tuple[list[float], int]:
    """Non-finite rewards become 0 and are counted (`reward/nonfinite`): one NaN would make the
    group's advantages, hence every update of the step, non-finite, and the step would be lost."""
    out = [r if math.isfinite(r) else 0.0 for r in rewards]
    return out, sum(not math.isfinite(r) for r in rewards)
