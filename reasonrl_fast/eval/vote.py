"""maj@n of one record, as the trainer's validation and eval both count it: its answers grouped
by mathematical equality, the largest group right or not. Apart from eval.run so that the
trainer's driver imports the vote without the evaluation command (and its checkpoint merging)."""

from __future__ import annotations

from reasonrl_fast.eval.metrics import maj_at_n
from reasonrl_fast.rewards.math import math_equal
from reasonrl_fast.rewards.score import ANSWER_SCORERS, scorer_for


def majority(record: dict, answers: list) -> bool | None:
    """maj@n of one prompt: None where the source's scorer is not one answer's equality (code,
    partition, GenRM: no answer to vote on)."""
    if scorer_for(record["data_source"]) not in ANSWER_SCORERS:
        return None
    truth = record["answer"]
    truths = [str(t) for t in truth] if isinstance(truth, (list, tuple)) else [str(truth)]
    # The winning group does not depend on the truth: right if it equals any acceptable answer.
    return any(maj_at_n(answers, t, math_equal) for t in truths)
