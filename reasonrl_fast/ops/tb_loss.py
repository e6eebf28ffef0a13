"""tb_loss: FlowRL's trajectory-balance loss, forward and backward in one kernel each
(docs/math.md §FlowRL trajectory balance)."""

from __future__ import annotations

import torch

from reasonrl_fast.ops._checks import check_devices, check_mask_dtype, dtype, value

_op = torch.ops.reasonrl_fast


def tb_loss(
    log_z: torch.Tensor,
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    reward: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float = 15.0,
    max_is_weight: float = 10.0,
    is_clip_eps: float | None = None,
    return_stats: bool = False,
):
    """loss = mean_b w[b] delta[b]^2, with

        delta[b] = log_z[b] + mean_t(logprob) - beta * reward[b] - mean_t(ref_logprob)
        w[b]     = stopgrad(min(exp(sum_t(logprob - old_logprob)), max_is_weight))

    (means and sums over the response mask). Gradients flow to log_z and logprob only.

    Args:
        log_z: [B] from the Z-head. logprob, ref_logprob, old_logprob, response_mask: [B, T].
        reward: [B], the group-normalised advantage (docs/math.md §Group advantage).
        is_clip_eps: the paper's variant, w clipped to [1 - eps, 1 + eps] instead of
            [0, max_is_weight].
        return_stats: also return {"delta": [B], "is_weight": [B]} (detached) for logging.
    """
    # Tensor shapes, dtypes and devices are checked by the kernels (and, under torch.compile,
    # by the fake implementations below); only the Python-level options are checked here.
    if is_clip_eps is not None:
        if not 0 <= is_clip_eps <= 1:
            raise ValueError(f"tb_loss: is_clip_eps must be in [0, 1], got {is_clip_eps}")
        lo, hi = 1.0 - is_clip_eps, 1.0 + is_clip_eps
    else:
        if not max_is_weight > 0:
            raise ValueError(f"tb_loss: max_is_weight must be > 0, got {max_is_weight}")
        lo, hi = 0.0, float(max_is_weight)
    loss, delta, w = _op.tb_loss(
        log_z, logprob, ref_logprob, old_logprob, reward, response_mask, float(beta), lo, hi
    )
    if return_stats:
        return loss, {"delta": delta.detach(), "is_weight": w.detach()}
    return loss


def _out_dtype(lp):
    return torch.float64 if lp.dtype == torch.float64 else torch.float32


# The fake implementations check what the kernels check (csrc/checks.h).
@torch.library.register_fake("reasonrl_fast::tb_loss")
def _(log_z, logprob, ref_logprob, old_logprob, reward, mask, beta, min_w, max_w):
    bt = tuple(logprob.shape)
    value(logprob.dim() == 2, f"tb_loss: logprob must be [B, T], got shape {bt}")
    for name, t in (("ref_logprob", ref_logprob), ("old_logprob", old_logprob), ("response_mask", mask)):
        value(t.shape == logprob.shape,
              f"tb_loss: {name} must have shape {bt} like logprob, got {tuple(t.shape)}")
    b = bt[0]
    for name, t in (("log_z", log_z), ("reward", reward)):
        value(t.dim() == 1 and t.shape[0] == b,
              f"tb_loss: {name} must be [B] = [{b}], got shape {tuple(t.shape)}")
    for name, t in (("log_z", log_z), ("logprob", logprob), ("ref_logprob", ref_logprob),
                    ("old_logprob", old_logprob), ("reward", reward)):
        dtype(t.dtype.is_floating_point, f"tb_loss: {name} must be floating point, got {t.dtype}")
    check_mask_dtype("tb_loss", mask)
    value(min_w <= max_w, f"tb_loss: min_is_weight {min_w} > max_is_weight {max_w}")
    check_devices("tb_loss", logprob, log_z, ref_logprob, old_logprob, reward, mask)
    dt = _out_dtype(logprob)
    return (logprob.new_empty((), dtype=dt), logprob.new_empty((b,), dtype=dt),
            logprob.new_empty((b,), dtype=dt))


@torch.library.register_fake("reasonrl_fast::tb_loss_backward")
def _(grad_loss, delta, is_weight, mask):
    op = "tb_loss_backward"
    value(grad_loss.dim() == 0, f"{op}: grad_loss must be a scalar, got shape {tuple(grad_loss.shape)}")
    value(delta.dim() == 1, f"{op}: delta must be [B], got shape {tuple(delta.shape)}")
    b = delta.shape[0]
    value(is_weight.dim() == 1 and is_weight.shape[0] == b,
          f"{op}: is_weight must be [B] = [{b}] like delta, got shape {tuple(is_weight.shape)}")
    value(mask.dim() == 2 and mask.shape[0] == b,
          f"{op}: mask must be [B, T] with B = {b} like delta, got shape {tuple(mask.shape)}")
    dtype(delta.dtype in (torch.float32, torch.float64),
          f"{op}: delta must be float32 or float64 (the forward's output), got {delta.dtype}")
    for name, t in (("grad_loss", grad_loss), ("is_weight", is_weight)):
        dtype(t.dtype.is_floating_point, f"{op}: {name} must be floating point, got {t.dtype}")
    check_mask_dtype(op, mask)
    check_devices(op, delta, grad_loss, is_weight, mask)
    return delta.new_empty((b,)), delta.new_empty(mask.shape)


def _setup_context(ctx, inputs, output):
    log_z, logprob, _, _, _, mask, *_ = inputs
    _, delta, w = output
    ctx.save_for_backward(delta, w, mask)
    ctx.dtypes = (log_z.dtype, logprob.dtype)
    ctx.mark_non_differentiable(delta, w)


def _backward(ctx, grad_loss, _gd, _gw):
    delta, w, mask = ctx.saved_tensors
    g_lz, g_lp = _op.tb_loss_backward(grad_loss, delta, w, mask)
    return g_lz.to(ctx.dtypes[0]), g_lp.to(ctx.dtypes[1]), None, None, None, None, None, None, None


torch.library.register_autograd("reasonrl_fast::tb_loss", _backward, setup_context=_setup_context)
