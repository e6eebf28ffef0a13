"""FAPO: GRPO on +1/-1 rewards in which a right answer that the GenRM flags as reached through a
flawed step is lowered (docs/math.md §FAPO rewards)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reasonrl_fast.algos.grpo import GRPO

if TYPE_CHECKING:
    import torch


def fapo_rewards(acc: list[bool], flagged: list[bool], penalty: float) -> torch.Tensor:
    """+1 right, -1 wrong, and 1 - penalty for a right answer the GenRM flags as flawed (0 with
    the default penalty 1)."""
    import torch

    r = [(1.0 - penalty * f) if a else -1.0 for a, f in zip(acc, flagged, strict=True)]
    return torch.tensor(r, dtype=torch.float32)


class FAPO(GRPO):
    name = "fapo"
    uses_genrm = True

    def outcome_rewards(self, cfg, scores, acc, flagged):
        return fapo_rewards(acc, flagged, cfg.fapo.penalty)
