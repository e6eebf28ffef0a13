"""What an embedded task gives the rest of the house: its records, the warm start's
demonstrations, and (where it has them) a step checker, task metrics and a rule judge.

A task is plain functions of the data config `d` (`cfg.data`) and records; it knows nothing of
the trainer. `data.task=NAME` picks one by name; a record file's rows find theirs by
`data_source`."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from reasonrl_fast.protocol import split_steps


def _no_metrics(items: list[dict], texts: list[str], acc: list[bool]) -> dict:
    return {}


def _no_check(cfg) -> None:
    return None


@dataclass(frozen=True)
class Task:
    name: str
    """The `data.task` value."""
    source: str
    """The `data_source` of its records (how a record file's rows find their task)."""
    split: Callable[..., list[dict]]
    """split(d, n, seed, part): `n` records from a seeded generator, for part "train" or "val" (a
    task with held-out prompts draws them from different pools)."""
    demonstration: Callable[[random.Random, object], tuple[str, str]]
    """demonstration(rng, d): one (prompt, response) of the embedded model's warm start."""
    sft_key: tuple = ()
    """Extra parts of the warm start's cache key (tasks that share demonstrations share a cache)."""
    step_checker: Callable[[str, str], int] | None = None
    """step_checker(prompt, response): index of the earliest wrong step, -1 when none (the ground
    truth of the flawed-positive metrics and of the GenRM agreement)."""
    request_steps: Callable[[str], list[str]] = split_steps
    """How a response is split into the steps a GenRM judges (default: its paragraphs, as FAPO)."""
    genrm_template: str = "fapo"
    """The GenRM prompt rendering `fapo.genrm.template=auto` uses on this embedded task."""
    rule_judge: Callable[[str], tuple[str, int, int]] | None = None
    """rule_judge(request text) -> (answer, verdict, steps): the exact GenRM the server runs as
    `rule:NAME` (protocol.RequestError for a request it cannot judge)."""
    val_metrics: Callable[[list[dict], list[str], list[bool]], dict] = field(default=_no_metrics)
    """val_metrics(items, texts, acc): the task's own validation metrics over the items that are
    its records ({} when there are none); one item, text and acc flag per sample."""
    check_config: Callable[[object], None] = field(default=_no_check)
    """check_config(cfg): a ConfigError when the run's settings cannot hold this embedded task."""
