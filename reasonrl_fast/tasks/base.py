"""What an embedded task gives the rest of the house: its records and their scorer, the warm
start's demonstrations, and (where it has them) a step checker, task metrics and a rule judge.

A task is a small class with default methods, like an algorithm (algos/base.py): a new one
subclasses `Task`, sets its name, data_source and scorer, writes `split` and `demonstration`,
overrides what else differs, and takes one line in `tasks.TASKS`. It reads the data config `d`
(`cfg.data`) and records, and knows nothing of the trainer. `data.task=NAME` picks one by name;
a record file's rows find theirs by `data_source`."""

from __future__ import annotations

import random
from collections.abc import Callable

from reasonrl_fast.protocol import split_steps
from reasonrl_fast.rewards.score import check_sandbox


class Task:
    name = ""
    """The `data.task` value."""
    source = ""
    """The `data_source` of its records (how a record file's rows find their task, and how the
    reward routing finds its scorer)."""
    scorer = "math"
    """How its records are scored: a kind of rewards/score.py's `SCORERS` ("math", "code",
    "genrm", ...), or "module:function" of a scorer of its own, called as
    fn(solution_str, ground_truth, extra_info) -> {"score", "acc"} in the reward workers."""
    genrm_template = "fapo"
    """The GenRM prompt rendering `fapo.genrm.template=auto` uses on this embedded task."""
    step_checker: Callable[[str, str], int] | None = None
    """step_checker(prompt, response): index of the earliest wrong step, -1 when none (the ground
    truth of the flawed-positive metrics and of the GenRM agreement); None: the task has none."""
    rule_judge: Callable[[str], tuple[str, int, int]] | None = None
    """rule_judge(request text) -> (answer, verdict, steps): the exact GenRM the server runs as
    `rule:NAME` (protocol.RequestError for a request it cannot judge); None: the task has none."""

    def split(self, d, n: int, seed: int, part: str = "train") -> list[dict]:
        """`n` records from a seeded generator, for part "train" or "val" (a task with held-out
        prompts draws them from different pools)."""
        raise NotImplementedError

    def demonstration(self, rng: random.Random, d) -> tuple[str, str]:
        """One (prompt, response) of the embedded model's warm start."""
        raise NotImplementedError

    def sft_key(self, d) -> tuple:
        """The parts of the warm start's cache key this task adds: the settings its demonstrations
        depend on (equal keys reuse one cached model)."""
        return ()

    def request_steps(self, response: str) -> list[str]:
        """How a response is split into the steps a GenRM judges (default: its paragraphs, as
        FAPO)."""
        return split_steps(response)

    def val_metrics(self, items: list[dict], texts: list[str], acc: list[bool]) -> dict:
        """The task's own validation metrics over the items that are its records ({} when there
        are none); one item, text and acc flag per sample."""
        return {}

    section = ""
    """The name of its own settings section under `data.` ("" none): `data.SECTION.*`."""
    Settings: type | None = None
    """The dataclass of that section (config/checks.py `Checks`, one docstring per field)."""

    def check_config(self, cfg) -> None:
        """A ConfigError when the run's settings cannot hold this embedded task."""

    def check_settings(self, cfg) -> None:
        """What config.validate asks of the run's embedded task: the sandbox limits of its
        scorer (rewards/score.py `check_sandbox`), then its own `check_config`."""
        check_sandbox(cfg, [self.source])
        self.check_config(cfg)
