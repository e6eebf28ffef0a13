"""What every algorithm shares: the reward shaping and group advantage of docs/math.md, and the
`Algo` interface the trainer calls. Pure functions of tensors; an algorithm reads its own config
section (`cfg.grpo`, `cfg.flowrl`, `cfg.fapo`, which it declares: `section`, `Settings`) and
nothing of the trainer.

An algorithm's facts (`zhead`, `uses_genrm`, `per_sequence`, `needs_ref`, `loss_units`,
`norm_by_std`) answer without torch: the memory planner and the config read them where torch may
not be installed. So this module and the algorithms' imports torch only inside the functions
that compute on tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float) -> torch.Tensor:
    """DAPO overlong shaping: min(-(L - (L_max - L_buf)) / L_buf * factor, 0) per response."""
    import torch

    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    over = lengths.float() - (max_len - buffer)
    return torch.clamp(-over / buffer * factor, max=0.0)


def advantages(rewards: torch.Tensor, group_ids: torch.Tensor, norm_by_std: bool = True) -> torch.Tensor:
    """Group-normalised advantage per response (GRPO's A and FlowRL's r-hat)."""
    from reasonrl_fast.ops import group_advantage

    return group_advantage(rewards.float(), group_ids, eps=1e-6, norm_by_std=norm_by_std)


def groups_with_spread(values, n: int) -> list[bool]:
    """DAPO's dynamic-sampling filter (SPEC §13): for each group of `n` consecutive samples,
    whether its values (acc flags or raw scores) are not all equal. A group whose samples all
    score alike has a zero advantage for every sample, so nothing to learn from."""
    values = list(values)
    if n < 1 or len(values) % n:
        raise ValueError(f"{len(values)} values do not make groups of {n}")
    return [len(set(values[g:g + n])) > 1 for g in range(0, len(values), n)]


class Algo:
    """One RL algorithm: how a step's rewards are formed, how advantages are normalised, which
    loss the update minimises and which extra parts the policy carries. A new one subclasses
    this, overrides what differs, and takes one line in `algos.ALGOS`."""

    name = ""
    section = ""
    """The name of its own settings section, at the top of the settings ("" none): `SECTION.*`."""
    Settings: type | None = None
    """The dataclass of that section (config/checks.py `Checks`, one docstring per field)."""
    uses_genrm = False
    """Right answers go to the GenRM judge, whose flags `rewards` receives (FAPO)."""
    zhead = False
    """The policy carries a Z-head (log Z of the prompt) that the loss trains (FlowRL)."""
    per_sequence = False
    """The loss weighs whole trajectories, so a rollout correction gives it one weight per
    response (algos/correction.py)."""

    def check_config(self, cfg) -> None:
        """A ConfigError when the run's settings cannot hold this algorithm (config.validate)."""

    def needs_ref(self, cfg) -> bool:
        """Whether the update needs the frozen reference policy's log-probs."""
        return False

    def outcome_rewards(self, cfg, scores: list[float], acc: list[bool], flagged: list[bool] | None) -> torch.Tensor:
        """Each response's reward from the scorers' scores and acc flags (and the GenRM's flags,
        for an algorithm that uses it), before any shaping by length."""
        import torch

        return torch.tensor(scores)

    overlong_setting = ""
    """The setting `overlong` reads its buffer from (errors name it)."""

    def overlong(self, cfg) -> tuple[int, float]:
        """(L_buf, factor) of the DAPO overlong shaping, from the algorithm's own section
        ((0, 1.0): off)."""
        return 0, 1.0

    def rewards(self, cfg, scores: list[float], acc: list[bool], flagged: list[bool] | None,
                lengths: torch.Tensor) -> torch.Tensor:
        """The step's reward per response: `outcome_rewards` plus the overlong penalty of its
        length in tokens (`lengths`), against rollout.max_new_tokens."""
        buffer, factor = self.overlong(cfg)
        return (self.outcome_rewards(cfg, scores, acc, flagged)
                + overlong_penalty(lengths, cfg.rollout.max_new_tokens, buffer, factor))

    def norm_by_std(self, cfg) -> bool:
        """Divide the group-centred rewards by the group's std."""
        return True

    def loss_units(self, cfg) -> str:
        """What the loss is a mean over: "tokens" or "sequences". A worker's micro-batch loss (a
        mean over its own units) is weighted by its share of the units of the whole mini-batch,
        over every micro-batch and worker, so the gradient is the one of the mean over all."""
        return "sequences"

    def loss(self, cfg, lp, old_lp, ref_lp, adv, mask, log_z, rollout_w=None,
             entropy=None) -> tuple[torch.Tensor, dict]:
        """(loss, stats) of one mini-batch: log-probs [B, T], advantages [B], mask [B, T];
        `rollout_w`: the rollout correction's weights ([B, T] or [B], detached) or None;
        `entropy`: the policy's entropy per token [B, T], with its gradient (an entropy bonus)."""
        raise NotImplementedError
