"""How a step's samples are cut for the update: mini-batches (optimizer updates) of a worker's
share, the bound on what one forward sees, and the weight sync's bucket. Plain integers and the
settings, no torch: config's checks, the rehearsal's scaling, the planner and the workers count
with these and nothing else (micro.py cuts a mini-batch into micro-batches by token budget)."""

from __future__ import annotations

from reasonrl_fast.util import mini_batch_count, shares  # noqa: F401 (re-exported)

SYNC_BUCKET_BYTES = 256 * 2 ** 20
"""Full tensors gathered per collective of the weight sync (trainer/fsdp.py `iter_full`)."""


def mini_batches(cfg, prompts: int) -> list[slice]:
    """A worker's mini-batches over its `prompts` prompts (each with rollout.n samples, prompt-major):
    `mini_batch_count` contiguous slices of samples, split by the same rule as the workers' shares
    (config checks that none is empty)."""
    n, count = cfg.rollout.n, mini_batch_count(cfg.data.prompts_per_step, cfg.optim.mini_batch_prompts)
    return [slice(r.start * n, r.stop * n) for r in shares(prompts, count)]


def largest_mini_batch(cfg, world: int) -> int:
    """Samples in the largest mini-batch of the largest worker's share of a step."""
    most = len(shares(cfg.data.prompts_per_step, world)[0])
    return max(s.stop - s.start for s in mini_batches(cfg, most))


def tokens_per_forward(cfg, world: int) -> int:
    """Upper bound on the response positions one policy forward sees: the largest mini-batch of the
    largest worker's share (prompts x samples) times the longest response, or the micro-batch
    token budget when that is less."""
    whole = max(1, largest_mini_batch(cfg, world)) * cfg.max_response
    return min(whole, cfg.optim.micro_batch_tokens) if cfg.optim.micro_batch_tokens else whole
