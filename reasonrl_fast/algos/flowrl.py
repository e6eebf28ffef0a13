"""FlowRL: trajectory balance against the reward distribution, with a learned log Z
(docs/math.md §FlowRL trajectory balance), through the fused `tb_loss`."""

from __future__ import annotations

from reasonrl_fast.algos.base import Algo
from reasonrl_fast.ops import tb_loss


def flowrl_loss(log_z, logprob, ref_logprob, old_logprob, adv, mask, beta=15.0, max_is_weight=10.0,
                is_clip_eps=None):
    """The TB loss of one mini-batch. Returns (loss, stats)."""
    loss, st = tb_loss(log_z, logprob, ref_logprob, old_logprob, adv.float(), mask.to(logprob.dtype),
                       beta=beta, max_is_weight=max_is_weight, is_clip_eps=is_clip_eps, return_stats=True)
    stats = {"log_z/mean": float(log_z.detach().float().mean()),
             "tb/delta_abs_mean": float(st["delta"].abs().mean()),
             "tb/is_weight_mean": float(st["is_weight"].mean())}
    return loss, stats


class FlowRL(Algo):
    name = "flowrl"
    zhead = True

    def needs_ref(self, cfg) -> bool:  # the TB loss reads the reference log-probs
        return True

    def loss(self, cfg, lp, old_lp, ref_lp, adv, mask, log_z):
        f = cfg.flowrl
        return flowrl_loss(log_z, lp, ref_lp, old_lp, adv, mask, f.beta, f.max_is_weight, f.is_clip_eps)
