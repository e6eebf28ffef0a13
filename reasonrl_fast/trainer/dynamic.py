"""DAPO's dynamic sampling (data.filter_groups; SPEC §13, docs/trainer.md §Dynamic sampling):
steps 1-2 of the loop's step in rounds. Each round generates and scores data.gen_prompts_per_step
prompts' groups; a group whose filter values (the scorer's acc or score) are all equal is dropped;
rounds go on until data.prompts_per_step groups are kept, and the step trains on exactly those
(the first ones kept, in order). A step that reaches data.max_gen_rounds without them stops the
run with one line (verl's behaviour: `GroupFilterError`).

The kept samples come back to the driver (tokens and the sampler's log-probs, cluster.py
`submit`), which sends each trainer worker its even share with the advantages: after the filter
the workers' own samples would not be an even split. Dropped groups count as generated, never as
trained, and in split placement never as stale: only the kept samples' staleness is reported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from reasonrl_fast.data.records import encode_prompts
from reasonrl_fast.errors import UserError
from reasonrl_fast.trainer.scoring import reward_metrics, rollout_and_score

if TYPE_CHECKING:  # cluster.py imports Ray, which the loop imports when the run starts
    from reasonrl_fast.trainer.cluster import Pending


class GroupFilterError(UserError, RuntimeError):
    """A step reached data.max_gen_rounds without the groups it trains on."""


@dataclass
class Round:
    """One generation round: its records, scored rollout (`rollout_and_score`, with `kept`), the
    collected generation, and the index its first sample had for the judge."""

    items: list[dict]
    roll: dict
    pending: Pending
    base: int


def fill_batch(run, step: int, first: Round | None = None) -> tuple[list[dict], dict, Pending, dict]:
    """Rounds of generation until the step's groups are kept; `first`: round 0 when it was
    submitted (and maybe scored) ahead, split placement's. Returns the kept groups' records,
    their rollout (the fields `rollout_and_score` returns, over the kept samples, and its
    metrics over every round), the batch for `Cluster.keep` and the rollout/* filter metrics
    (docs/trainer.md §Metrics). FAPO's judge is sent the kept groups' right answers, numbered
    across the rounds: its verdicts are the batch's by `base` + index."""
    d, n = run.cfg.data, run.cfg.rollout.n
    want = d.prompts_per_step
    rounds: list[Round] = []
    kept: list[tuple[int, int]] = []  # (round, group) in the order kept
    while len(kept) < want:
        k = len(rounds)
        if first is not None and k == 0:
            rd = first
        else:
            if d.max_gen_rounds and k == d.max_gen_rounds:
                raise GroupFilterError(
                    f"step {step}: {len(kept)} of data.prompts_per_step={want} groups kept after "
                    f"data.max_gen_rounds={d.max_gen_rounds} rounds of {d.gen_prompts()} prompts "
                    f"(data.filter_groups={d.filter_groups} drops groups whose samples all score alike): raise "
                    f"data.gen_prompts_per_step or data.max_gen_rounds (0: no limit), or train on prompts the "
                    f"policy gets right only sometimes")
            rd = generate_round(run, step, k, sum(len(x.items) for x in rounds) * n)
        rounds.append(rd)
        kept += [(k, g) for g, keep in enumerate(rd.roll["kept"]) if keep]
    return _batch(rounds, kept[:want], n, step - 1 if run.cluster.split else None)


def generate_round(run, step: int, k: int, base: int) -> Round:
    """Round `k` of `step`: fresh prompts from the sampler, sampled with seeds of its own (round
    0's are the step's, as without the filter), scored as they arrive."""
    cfg = run.cfg
    items = [run.train_set[i] for i in run.sampler.next(cfg.data.gen_prompts())]
    r = cfg.rollout
    pending = run.cluster.submit(encode_prompts(items, run.tok), r.n, r.temperature, r.top_p,
                                 step if k == 0 else f"{step}/round{k}")
    return Round(items, score_round(run, items, pending, base), pending, base)


def score_round(run, items: list[dict], pending: Pending, base: int = 0) -> dict:
    """Collect and score a submitted round (`rollout_and_score`), each group's filter verdict in
    `kept`; its right answers go to the judge as `base` + their index."""
    r = run.cfg.rollout
    return rollout_and_score(run.cluster, run.pool, run.tok, items, r.n, r.temperature, r.top_p, None,
                             run.judge, pending=pending, spread=run.cfg.data.filter_groups, index_base=base)


def _batch(rounds: list[Round], kept: list[tuple[int, int]], n: int, trainer_version: int | None) -> tuple:
    """The step's batch from the kept (round, group)s; `trainer_version`: the weights the update
    starts from, in split placement (the kept samples' staleness is measured against it)."""
    samples = [(k, g * n + j) for k, g in kept for j in range(n)]
    items = [rounds[k].items[g] for k, g in kept]

    def pick(key: str) -> list:
        return [rounds[k].roll[key][i] for k, i in samples]

    roll = {"prompts": [rounds[k].roll["prompts"][g] for k, g in kept], "responses": pick("responses"),
            "texts": pick("texts"), "scores": pick("scores"), "acc": pick("acc"),
            "judge_index": [rounds[k].base + i for k, i in samples]}
    counts: dict = {}
    for rd in rounds:
        for key, v in rd.roll["counts"].items():
            counts[key] = counts.get(key, 0) + v
    roll["metrics"] = reward_metrics(counts, [x for rd in rounds for x in rd.roll["latencies"]],
                                     sum(rd.roll["nonfinite"] for rd in rounds))
    roll["time/rollout_s"] = sum(rd.roll["time/rollout_s"] for rd in rounds)
    roll["time/reward_s"] = sum(rd.roll["time/reward_s"] for rd in rounds)
    from reasonrl_fast.trainer.cluster import Pending

    batch = Pending.batch(roll["prompts"], [rounds[k].pending.responses[i] for k, i in samples],
                          [rounds[k].pending.logprobs[i] for k, i in samples],
                          [rounds[k].pending.versions[i] for k, i in samples], n,
                          min(rounds[k].pending.version for k, _ in kept))
    batch.rollout_idle_s = sum(rd.pending.rollout_idle_s for rd in rounds)
    generated = sum(len(rd.roll["acc"]) for rd in rounds)
    metrics = {"rollout/gen_rounds": len(rounds),
               "rollout/groups_generated": generated // n,
               "rollout/groups_kept": sum(sum(rd.roll["kept"]) for rd in rounds),
               "rollout/generated_per_trained": generated / len(samples),
               "accuracy/generated_mean": sum(sum(rd.roll["acc"]) for rd in rounds) / generated}
    if trainer_version is not None:  # what trains, token by token: a dropped group is never stale
        metrics.update(batch.staleness(trainer_version))
    return items, roll, batch, metrics
