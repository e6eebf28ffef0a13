"""What the GenRM is asked and how its answer is read (FAPO, docs/fapo.md).

The GenRM sees a problem, its reference answer and a solution split into steps numbered from 0,
and answers with the index of the earliest wrong step inside \\boxed{}, or -1 when every step
is right. Two renderings of the same three fields:
- "fapo": the full instruction, for real models (steps are the solution's paragraphs);
- "compact": `problem+answer|step|step|`, for the embedded model, whose character tokenizer
  and 256 positions cannot hold the full one (steps are the addition task's columns).
`parse_request` reads either back (the rule judge uses it), `parse_verdict` reads the answer.
"""

from __future__ import annotations

import re

from reasonrl_fast.rewards.math import extract_boxed

TEMPLATES = ("fapo", "compact")

_FAPO = """You are given a math problem, its reference answer, and a proposed solution split into \
steps numbered from 0.

[Problem]
{problem}

[Reference answer]
{answer}

[Solution]
{steps}

Check the steps in order. If a step contains an error (a wrong calculation, a false claim, or an \
unjustified conclusion), give the index of the earliest wrong step; if every step is correct, \
give -1. Put the index in \\boxed{{}}."""

_STEP = "<step_{i}>\n{text}\n</step_{i}>"


def split_steps(solution: str) -> list[str]:
    """A solution's steps: its non-empty paragraphs (blank-line separated), as FAPO splits them."""
    return [p.strip() for p in re.split(r"\n\s*\n", solution) if p.strip()]


def render(template: str, problem: str, answer: str, steps: list[str]) -> str:
    """The GenRM's user message for these fields."""
    if template == "fapo":
        body = "\n".join(_STEP.format(i=i, text=s) for i, s in enumerate(steps))
        return _FAPO.format(problem=problem.strip(), answer=str(answer).strip(), steps=body)
    if template == "compact":
        def field(x) -> str:  # a '|' inside a field would shift the steps: it becomes '/'
            return str(x).replace("|", "/")
        return "|".join([field(problem) + field(answer), *map(field, steps)]) + "|"
    raise ValueError(f"unknown GenRM template {template!r}: expected one of {TEMPLATES}")


_FAPO_RE = re.compile(r"\[Problem\]\n(.*?)\n\n\[Reference answer\]\n(.*?)\n\n\[Solution\]\n(.*)\n\nCheck the steps",
                      re.S)
_STEP_RE = re.compile(r"<step_(\d+)>\n(.*?)\n</step_\1>", re.S)


def parse_request(text: str) -> tuple[str, str, list[str]] | None:
    """(problem, answer, steps) of a message written by `render` (either template), or None."""
    m = _FAPO_RE.search(text)
    if m:
        return m.group(1), m.group(2), [s for _, s in _STEP_RE.findall(m.group(3))]
    if text.count("|") >= 1 and "=" in text.split("|", 1)[0]:
        head, *steps = text.split("|")
        problem, _, answer = head.rpartition("=")
        return problem + "=", answer, steps[:-1] if steps and steps[-1] == "" else steps
    return None


def parse_verdict(text: str, n_steps: int) -> int | None:
    """The verdict in a GenRM answer: the integer in its last \\boxed{}, when it is -1 or a step
    index below `n_steps`; None for no box, a non-integer, or an index out of range (the
    caller then applies no penalty)."""
    box = extract_boxed(text or "")
    if box is None:
        return None
    box = box.strip()
    if not re.fullmatch(r"-?\d{1,6}", box):
        return None
    k = int(box)
    return k if k == -1 or 0 <= k < n_steps else None
