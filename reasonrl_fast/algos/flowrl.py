"""FlowRL: trajectory balance against the reward distribution, with a learned log Z
(docs/math.md §FlowRL trajectory balance), through the fused `tb_loss`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from reasonrl_fast.algos.base import Algo
from reasonrl_fast.config.checks import Checks
from reasonrl_fast.errors import ConfigError


def flowrl_loss(log_z, logprob, ref_logprob, old_logprob, adv, mask, beta=15.0, max_is_weight=10.0,
                is_clip_eps=None, rollout_weight=None):
    """The TB loss of one mini-batch; `rollout_weight` [B] (detached): the rollout correction,
    multiplied into each trajectory's importance weight. Returns (loss, stats)."""
    from reasonrl_fast.ops import tb_loss

    mask = mask.to(logprob.dtype)
    if rollout_weight is not None:
        old_logprob, max_is_weight, is_clip_eps = _carry_weight(logprob, old_logprob, mask, rollout_weight,
                                                                max_is_weight, is_clip_eps)
    loss, st = tb_loss(log_z, logprob, ref_logprob, old_logprob, adv.float(), mask,
                       beta=beta, max_is_weight=max_is_weight, is_clip_eps=is_clip_eps, return_stats=True)
    stats = {"log_z/mean": float(log_z.detach().float().mean()),
             "tb/delta_abs_mean": float(st["delta"].abs().mean()),
             "tb/is_weight_mean": float(st["is_weight"].mean())}
    return loss, stats


def _carry_weight(logprob, old_logprob, mask, rollout_weight, max_is_weight, is_clip_eps):
    """The TB op weighs trajectory b by w[b] = clip(exp(sum_t(lp - lp_old))), detached. The
    corrected weight is c[b] * w[b]; the op carries it exactly when lp_old is replaced by
    lp - log(c[b] w[b]) / n[b] on the response tokens and the op's own clip is lifted (w is
    clipped here first, by the same rule). A response without tokens keeps weight 1, which is
    also its rollout weight (an empty sum of log-ratios)."""
    import torch

    with torch.no_grad():
        dt = torch.promote_types(logprob.dtype, torch.float32)  # fp32 at least: n log-ratios are summed
        lp, m = logprob.detach().to(dt), mask.to(dt)
        w = (((lp - old_logprob.to(dt)) * m).sum(-1)).exp()
        w = w.clamp(1 - is_clip_eps, 1 + is_clip_eps) if is_clip_eps is not None else w.clamp(0.0, max_is_weight)
        log_total = (w * rollout_weight.to(dt)).clamp(min=torch.finfo(dt).tiny).log()
        old = lp - (log_total / m.sum(-1).clamp(min=1)).unsqueeze(-1) * m
    return old.to(old_logprob.dtype), float("inf"), None


@dataclass
class FlowRLConfig(Checks):
    """FlowRL's settings (`flowrl.*`)."""

    beta: float = 15.0
    """Reward temperature beta of the trajectory-balance loss."""
    max_is_weight: float = 10.0
    """Cap of the importance weight."""
    is_clip_eps: Optional[float] = None
    """Paper variant: clip the importance weight to [1-eps, 1+eps] instead."""
    zhead_layers: int = 3
    """Layers of the Z-head MLP."""
    zhead_lr_mult: float = 1.0
    """Learning-rate multiplier for the Z-head parameters."""
    zhead_pooling: str = "all"
    """The prompt positions log Z pools: all (SPEC §5, the default: every prompt token, the last
    one too, which has read the whole prompt) or published (all but the last, as verl's FlowRL
    actors, whose `proj_z` checkpoints were trained so)."""
    overlong_buffer: int = 0
    """DAPO overlong shaping of FlowRL's rewards: buffer L_buf in tokens (0: off; the published
    FlowRL runs shape with 4096, as DAPO)."""
    overlong_factor: float = 1.0
    """DAPO overlong penalty factor of FlowRL's rewards."""

    def check(self, at: str = "flowrl.") -> None:
        # beta scales the advantage in the target pi_ref exp(beta r): 0 ignores the reward, a
        # negative beta trains toward the wrong answers
        self._positive(at, "beta", "max_is_weight", "zhead_layers")
        self._between(at, "is_clip_eps", 0, 1, lo_open=True)  # the weight's clip [1 - eps, 1 + eps]
        self._not_negative(at, "zhead_lr_mult", "overlong_buffer", "overlong_factor")  # 0: a frozen Z-head
        self._one_of(at, "zhead_pooling", ("all", "published"))


class FlowRL(Algo):
    name = "flowrl"
    section, Settings = "flowrl", FlowRLConfig
    overlong_setting = "flowrl.overlong_buffer"
    zhead = True
    per_sequence = True

    def needs_ref(self, cfg) -> bool:  # the TB loss reads the reference log-probs
        return True

    def overlong(self, cfg) -> tuple[int, float]:
        return cfg.flowrl.overlong_buffer, cfg.flowrl.overlong_factor

    def check_config(self, cfg) -> None:
        # FlowRL's overlong shaping was once read from the grpo section: a config written then
        # would lose its shaping without a word, so it is named instead.
        if cfg.grpo.overlong_buffer > 0:
            raise ConfigError(f"grpo.overlong_buffer={cfg.grpo.overlong_buffer} is GRPO's overlong shaping, which "
                              f"algo=flowrl does not read: set flowrl.overlong_buffer (and "
                              f"flowrl.overlong_factor) for FlowRL's, and grpo.overlong_buffer=0")

    def loss(self, cfg, lp, old_lp, ref_lp, adv, mask, log_z, rollout_w=None, entropy=None):
        f = cfg.flowrl
        return flowrl_loss(log_z, lp, ref_lp, old_lp, adv, mask, f.beta, f.max_is_weight, f.is_clip_eps, rollout_w)
