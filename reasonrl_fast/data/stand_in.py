"""Stand-in records: a few small records in the verl schema, of the kind a recipe's data file
holds, each with a reference response its scorer counts right. The CPU rehearsal
(reasonrl_fast/rehearse.py) trains on them in place of the recipe's files and warm-starts its
stand-in model on the reference responses.

One example per scorer kind (`EXAMPLES`, the keys of rewards/score.py `SCORERS`): a new scorer
kind gets its example here, next to the others (tests/test_rehearse.py checks the keys match).
"""

from __future__ import annotations

import json
import os
from typing import Callable, NamedTuple

SUMS = [(0, 1), (1, 0), (1, 1), (2, 0), (0, 2)]  # answers 1 or 2: a warm-started guess is often right


class Example(NamedTuple):
    content: str  # the user message
    ability: str
    ground_truth: str
    extra_info: dict
    response: str  # the reference response, scored right


def _answer(i: int, a: int, b: int) -> Example:
    """A math answer in \\boxed{} (the math, DAPO and box-only scorers all read it)."""
    return Example(f"{a}+{b}", "math", str(a + b), {}, f"\\boxed{{{a + b}}}")


def _program(i: int, a: int, b: int) -> Example:
    """A HumanEval-style function and its test."""
    fn = f"f{i}"
    test = f"def check(candidate):\n    assert candidate() == {a + b}\n"
    return Example(f"def {fn}():", "code", json.dumps({"test": test, "entry_point": fn}), {},
                   f"```python\ndef {fn}():\n    return {a + b}\n```")


def _verdict(i: int, a: int, b: int) -> Example:
    """A GenRM judgment: the index of a solution's first wrong step, or -1 (the compact
    rendering: the full instruction alone is longer than a scaled prompt)."""
    from reasonrl_fast.protocol import render

    flawed = i % 2
    steps = [f"{a}+{b}={a + b + flawed}"]
    truth = str(0 if flawed else -1)
    return Example(render("compact", f"{a}+{b}", str(a + b), steps), "genrm", truth,
                   {"problem": f"{a}+{b}", "answer": str(a + b), "steps": steps}, f"\\boxed{{{truth}}}")


EXAMPLES: dict[str, Callable[[int, int, int], Example]] = {
    "math": _answer, "dapo": _answer, "boxed": _answer, "code": _program, "genrm": _verdict}
"""The i-th example (of the sum a+b) per scorer kind; an embedded task's own scorer kind
("module:function") gets the math answer."""


def data_source_of(path: str) -> str:
    """The data_source the records of a recipe's file carry: the one data/prepare.py writes for
    the set its name names (dapo-math-17k -> math_dapo, aime24, humaneval, ...), `genrm` for
    GenRM training records, else math. (The config names no data source: the records carry it.)"""
    from reasonrl_fast.data.prepare import NAMES

    stem = os.path.basename(path).split(".")[0].lower()
    for name, (source, _) in sorted(NAMES.items(), key=lambda kv: -len(kv[0])):
        if source and name in stem:
            return source
    return "genrm" if "genrm" in stem else "math"


def stand_in_records(source: str, count: int) -> list[tuple[dict, str]]:
    """`count` (verl-schema record, reference response) pairs of `source`'s kind (its scorer,
    rewards/score.py `scorer_for`), the example of that kind (`EXAMPLES`)."""
    from reasonrl_fast.rewards.score import scorer_for

    example = EXAMPLES.get(scorer_for(source), _answer)
    out = []
    for i in range(count):
        e = example(i, *SUMS[i % len(SUMS)])
        record = {"data_source": source, "prompt": [{"role": "user", "content": e.content}], "ability": e.ability,
                  "reward_model": {"style": "rule", "ground_truth": e.ground_truth},
                  "extra_info": {**e.extra_info, "index": i}}
        out.append((record, e.response))
    return out
