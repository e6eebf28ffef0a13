"""The embedded code task: short stdin/stdout programming problems that fit the tiny model's
context, scored in the sandbox like any code source."""

from __future__ import annotations

import json
import random

from reasonrl_fast.tasks import addition
from reasonrl_fast.tasks.base import Task

# Short stdin/stdout problems (the prompt, then the function that answers an input line), so a
# code run fits the tiny model's 256 positions. Scored in the sandbox like any code source.
CODE_PROBLEMS = [
    ("Read two integers on one line; print their sum.", lambda a, b: a + b),
    ("Read two integers on one line; print their product.", lambda a, b: a * b),
    ("Read two integers on one line; print the larger.", max),
    ("Read two integers on one line; print their difference.", lambda a, b: a - b),
]


def code_split(n: int, seed: int, cases: int = 3) -> list[dict]:
    """`n` problems drawn from CODE_PROBLEMS, each with `cases` random stdin/stdout tests in
    the `{"inputs", "outputs"}` ground-truth encoding."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        text, fn = rng.choice(CODE_PROBLEMS)
        pairs = [(rng.randint(-99, 99), rng.randint(-99, 99)) for _ in range(cases)]
        truth = {"inputs": [f"{a} {b}\n" for a, b in pairs], "outputs": [f"{fn(a, b)}\n" for a, b in pairs]}
        items.append({"prompt": f"{text}\n```python\n", "answer": json.dumps(truth), "data_source": "code"})
    return items


# The tiny model has no code demonstrations: the code task starts from the addition warm start
# (same demonstrations, same cache), which teaches it the tokenizer and to stop.
class Code(Task):
    name, source, scorer = "code", "code", "code"

    def split(self, d, n: int, seed: int, part: str = "train") -> list[dict]:  # train and val: draws alike
        return code_split(n, seed)

    def demonstration(self, rng: random.Random, d) -> tuple[str, str]:
        return addition.demonstration(rng, d)
