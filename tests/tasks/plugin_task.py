"""A task from outside the package, added as a user adds one: this module and one registry line,
`TASKS["reverse"] = "tests.tasks.plugin_task:Reverse"` (tests/tasks/test_plugin_task.py). Prompt
`reverse abc:`, answer the reversed letters in \\boxed{}, scored by the task's own scorer, whose
rewards (2 / -0.5) no built-in scorer gives."""

from __future__ import annotations

import random

from reasonrl_fast.tasks.base import Task
from reasonrl_fast.util import extract_boxed

PATH = f"{__name__}:Reverse"


def reverse_score(solution_str: str, ground_truth, extra_info: dict | None = None) -> dict:
    right = extract_boxed(solution_str) == ground_truth
    return {"score": 2.0 if right else -0.5, "acc": right}


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcd") for _ in range(3))


class Reverse(Task):
    name = source = "reverse"
    scorer = f"{__name__}:reverse_score"

    def split(self, d, n: int, seed: int, part: str = "train") -> list[dict]:
        rng = random.Random(seed)
        return [{"prompt": f"reverse {w}:", "answer": w[::-1], "data_source": self.source}
                for w in (_word(rng) for _ in range(n))]

    def demonstration(self, rng: random.Random, d) -> tuple[str, str]:
        w = _word(rng)
        return f"reverse {w}:", f"\\boxed{{{w[::-1]}}}"
