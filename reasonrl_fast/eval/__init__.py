"""Evaluation: metrics.py (pass_at_k, mean_at_n, maj_at_n, se@n, per-source summaries) and the
eval command (`python -m reasonrl_fast.eval`, run.py)."""

from reasonrl_fast.eval.metrics import maj_at_n, mean_at_n, pass_at_k, standard_error, summarize

__all__ = ["maj_at_n", "mean_at_n", "pass_at_k", "standard_error", "summarize"]
