"""The GenRM's own training reward (docs/math.md §FAPO rewards): a verdict on a solution's steps
(the index of the earliest wrong step, or -1) scored against the true index.

    wrong in kind (flags a flawless solution, misses a flaw, or cannot be read)   -1
    both say "no error"                                                             +1
    both say "flawed"                                                  1 - |t_hat - t*| / n

`acc` is exact agreement (t_hat == t*), so `val/accuracy` is step-index accuracy.
"""

from __future__ import annotations

from typing import Any

from reasonrl_fast.protocol import step_verdict


def genrm_reward(verdict: int | None, truth: int, n_steps: int) -> float:
    """The reward of a parsed verdict (None: unreadable) against the true index `truth`."""
    if verdict is None or (verdict == -1) != (truth == -1):
        return -1.0
    if truth == -1:
        return 1.0
    return 1.0 - abs(verdict - truth) / n_steps


def genrm_score(solution_str: str, ground_truth: Any, extra_info: dict | None) -> dict:
    """{"score", "acc"} of one GenRM answer. `ground_truth` is the true earliest wrong step
    (an integer or its string, -1 when none); `extra_info["steps"]` the judged solution's steps,
    whose count bounds a readable verdict and scales the partial credit."""
    if not isinstance(extra_info, dict) or "steps" not in extra_info:
        raise ValueError("a genrm record needs `extra_info.steps` (the judged solution's steps): "
                         f"got extra_info={extra_info!r:.80}")
    steps = extra_info["steps"]
    if not isinstance(steps, (list, tuple)) or not steps:
        raise ValueError(f"`extra_info.steps` of a genrm record must be a non-empty list, "
                         f"got {steps!r:.80}")
    try:
        truth = int(ground_truth)
    except (TypeError, ValueError):
        raise ValueError(f"a genrm ground truth is an integer step index (-1: none), "
                         f"got {ground_truth!r:.80}") from None
    n = len(steps)
    if not -1 <= truth < n:
        raise ValueError(f"genrm ground truth {truth} is outside [-1, {n}) for {n} steps in "
                         f"`extra_info.steps`")
    verdict = step_verdict(solution_str, n)  # an index in range, whatever the prompt's template
    return {"score": genrm_reward(verdict, truth, n), "acc": verdict == truth}
