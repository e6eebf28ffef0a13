"""Route TRL's per-token log-prob and entropy code through the fused ops (TRL 1.16).

    from reasonrl_fast.integrations import trl as rf_trl
    rf_trl.patch()                     # before building the trainer
    trainer = GRPOTrainer(...)

What is replaced, in every loaded `trl.*` module that holds the original object (TRL's modules
bind these names by `from ... import`, so patching the defining module alone would miss them;
modules imported later copy the replacement from the defining module):

- `ChunkedLogProbFunction` (trl.kernels), the fused LM head behind `add_fused_lm_head` that the
  GRPO, RLOO, DPO, KTO and SFT trainers use: `linear_token_logprob`, logits never materialised.
- `selective_log_softmax`, `entropy_from_logits`, `selective_log_softmax_and_entropy`
  (trl.trainer.utils), for logits already materialised: `token_logprob`.

The contract is TRL's: each replacement returns what TRL's function returns for the same call
(dtype, shape, every output) within floating-point rounding, and raises TRL's error for input
TRL refuses. docs/math.md §Token log-prob and entropy and §Fused LM head give the semantics:
the temperature divides the logits; a logit scale multiplies them (folded into the
temperature: z * s / T = z / (T / s)); the head computes in the autocast dtype when autocast is
on, else in the hidden states' dtype; rows that `row_mask` zeroes give 0 and no gradient.
Dtypes follow TRL's dispatch: where TRL would run its fused Triton kernel the outputs are
float32, as that kernel's; elsewhere they are the logits' dtype; the fused head's are float32.

A call the ops cannot compute as TRL does goes to TRL's own function, and the first such call of
each kind logs a warning (logger `reasonrl_fast.integrations.trl`):
- materialised float16/bfloat16 logits outside TRL's Triton kernel: TRL computes these with
  torch's log_softmax in that precision, and its contract (its tests compare with torch.equal)
  is those exact bits; the ops accumulate in float32 and round differently;
- fused-head calls asking for `log_sum_sq_probs` or `is_top1` (they need a second pass over the
  vocabulary: the maximum, the sum of squared probabilities), or with
  `final_logit_softcapping`, a logit scale <= 0 or a temperature <= 0;
- any input the ops refuse (TRL then raises its own error, or computes it).
`mean_logits` is computed beside the ops: the mean over the vocabulary of a linear head is the
head applied to the mean weight row, one [H] vector, no second pass.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

import torch

from reasonrl_fast.integrations import _patch
from reasonrl_fast.ops import linear_token_logprob, token_logprob

log = logging.getLogger(__name__)

# Where TRL defines each name this module replaces.
_HEAD = ("trl.kernels.chunked_logprob", "ChunkedLogProbFunction")
_UTILS = "trl.trainer.utils"
# TRL's head outputs besides log_probs, in the order apply() returns them.
_OPTIONAL = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
# ignore_index for rows a row_mask skips. TRL never uses it as an id, and an id that is neither a
# valid one nor this value still fails in the op (IndexError), as TRL's own gather would.
_SKIP = -(2**62)
# The ops' errors for input they refuse (NotImplementedError: a device they have no kernel
# for); such a call is handed to TRL's own function.
_REFUSED = (IndexError, ValueError, TypeError, NotImplementedError)
_ROWS = 4096  # rows per block for mean_logits (TRL's TOKEN_CHUNK_SIZE): bounds its fp32 copy

_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("reasonrl_fast.integrations.trl: %s; TRL's own function computes these "
                    "calls (this warning is shown once)", message)


def _trl_after_refusal(name: str, trl_fn: Callable, args: tuple, err: Exception) -> Any:
    """TRL's result for an input the ops refused: TRL raises its own error for input it refuses
    too (called outside the `except` block, so that error is not chained to ours)."""
    out = trl_fn(*args)
    _warn_once(f"refused:{name}", f"{name}: the ops refused an input TRL accepts ({err})")
    return out


# ----------------------------------------------------------------------- the fused LM head

def _head_handback(temperature: float, softcap: float | None, logit_scale: float,
                   outputs: tuple) -> tuple[str, str] | None:
    """(kind, why) when TRL's own head must compute this call, else None."""
    if softcap is not None:
        return "softcap", f"final_logit_softcapping={softcap}: the ops have no soft-capping"
    if not logit_scale > 0:
        return "scale", f"logit scale {logit_scale}: only a scale > 0 folds into the temperature"
    if not temperature > 0:
        return "temperature", f"temperature {temperature}: the ops take a temperature > 0"
    extra = [o for o in ("log_sum_sq_probs", "is_top1") if o in outputs]
    if extra:
        return "outputs", (f"outputs {extra}: the ops' single pass keeps neither the largest "
                           f"logit nor the sum of squared probabilities")
    return None


def _mean_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 scale: float) -> torch.Tensor:
    """mean_v(h·W_v + b_v) * scale = (h·mean(W) + mean(b)) * scale, in float32 (TRL sums its
    float32 copies of the tiles' logits), for the inputs already cast to the compute dtype."""
    with torch.no_grad():
        w_mean = weight.mean(0, dtype=torch.float32)
        b_mean = bias.mean(dtype=torch.float32) if bias is not None else 0.0
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for r in range(0, hidden.shape[0], _ROWS):
            out[r:r + _ROWS] = (hidden[r:r + _ROWS].float() @ w_mean + b_mean) * scale
    return out


def _make_head(original: type, entropy: bool) -> type:
    """A stand-in for TRL's ChunkedLogProbFunction: same apply() arguments, same five outputs."""

    class ChunkedLogProbFunction:
        """TRL's fused LM head, computed by reasonrl_fast.ops.linear_token_logprob."""

        trl_original = original

        @staticmethod
        def apply(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  targets: torch.Tensor, temperature: float, chunk_size: int,
                  final_logit_softcapping: float | None = None, logit_scale: float = 1.0,
                  outputs: tuple[str, ...] = _OPTIONAL):
            args = (hidden, weight, bias, targets, temperature, chunk_size,
                    final_logit_softcapping, logit_scale, outputs)
            want_entropy = "entropy" in outputs
            if want_entropy and not entropy:  # patch(entropy=False): entropy stays TRL's
                return original.apply(*args)
            why = _head_handback(temperature, final_logit_softcapping, logit_scale, outputs)
            if why is not None:
                _warn_once(f"head:{why[0]}", f"ChunkedLogProbFunction: {why[1]}")
                return original.apply(*args)
            kind = hidden.device.type
            autocast = torch.is_autocast_enabled(kind)
            dtype = torch.get_autocast_dtype(kind) if autocast else hidden.dtype
            # The op takes one dtype for all three; TRL casts the same way before its GEMMs.
            # Autocast is switched off inside so the op's GEMMs stay in that dtype.
            h, w = hidden.to(dtype), weight.to(dtype)
            b = None if bias is None else bias.to(dtype)
            try:
                with torch.autocast(kind, enabled=False):
                    res = linear_token_logprob(h, w, targets, temperature / logit_scale,
                                               ignore_index=_SKIP, bias=b,
                                               return_entropy=want_entropy)
                    mean = (_mean_logits(h, w, b, logit_scale / temperature)
                            if "mean_logits" in outputs else None)
            except _REFUSED as e:
                err = e
            else:
                lp, ent = res if want_entropy else (res, None)
                # TRL keeps its statistics in float32 whatever the compute dtype
                return lp.float(), (None if ent is None else ent.float()), None, mean, None
            return _trl_after_refusal("ChunkedLogProbFunction", original.apply, args, err)

    return ChunkedLogProbFunction


# ------------------------------------------------------------------ materialised logits

def _make_logits_fns(trl_sls: Callable, trl_entropy: Callable, trl_both: Callable,
                     trl_kernel: Callable[..., bool]) -> dict[str, Callable]:
    """The replacements of selective_log_softmax, entropy_from_logits and
    selective_log_softmax_and_entropy. `trl_kernel(logits, index=None, row_mask=None)` is
    whether TRL itself would run its Triton kernel on the call (float32 outputs)."""

    def out_dtype(logits: torch.Tensor, index=None, row_mask=None) -> torch.dtype | None:
        """The dtype TRL returns, when the ops reproduce TRL's numbers; None: TRL computes."""
        if trl_kernel(logits, index, row_mask):
            return torch.float32
        if logits.dtype in (torch.float32, torch.float64):  # the ops return these dtypes
            return logits.dtype
        if logits.dtype in (torch.float16, torch.bfloat16):
            _warn_once("half", "float16/bfloat16 logits outside TRL's Triton kernel: TRL "
                               "returns torch's own log_softmax in that precision, bit for bit")
        return None

    def targets(index: torch.Tensor, row_mask: torch.Tensor | None) -> torch.Tensor:
        return index if row_mask is None else index.masked_fill(row_mask == 0, _SKIP)

    def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor,
                              temperature: float = 1.0,
                              row_mask: torch.Tensor | None = None) -> torch.Tensor:
        """TRL's selective_log_softmax (index [...] or [..., K]) with token_logprob."""
        args = (logits, index, temperature, row_mask)
        k_ids = index.ndim == logits.ndim and index.shape[:-1] == logits.shape[:-1]
        if not temperature > 0 or not (k_ids or index.shape == logits.shape[:-1]):
            return trl_sls(*args)  # TRL's error (or TRL's answer for shapes gather accepts)
        dtype = out_dtype(logits, index, row_mask)
        if dtype is None:
            return trl_sls(*args)
        z = logits
        if k_ids:
            # K ids per row: the logits are viewed K times (stride 0, no copy)
            z = logits.unsqueeze(-2).expand(*index.shape, logits.shape[-1])
        try:
            return token_logprob(z, targets(index, row_mask), temperature, _SKIP).to(dtype)
        except _REFUSED as e:
            err = e
        return _trl_after_refusal("selective_log_softmax", trl_sls, args, err)

    def entropy_from_logits(logits: torch.Tensor, chunk_size: int = 128) -> torch.Tensor:
        """TRL's entropy_from_logits with token_logprob (one pass, no chunking needed)."""
        dtype = out_dtype(logits)
        if dtype is None:
            return trl_entropy(logits, chunk_size)
        try:
            ids = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
            return token_logprob(logits, ids, return_entropy=True)[1].to(dtype)
        except _REFUSED as e:
            err = e
        return _trl_after_refusal("entropy_from_logits", trl_entropy, (logits, chunk_size), err)

    def selective_log_softmax_and_entropy(
        logits: torch.Tensor, index: torch.Tensor, entropy_requires_grad: bool = True,
        temperature: float = 1.0, row_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """TRL's selective_log_softmax_and_entropy: both from one token_logprob pass."""
        args = (logits, index, entropy_requires_grad, temperature, row_mask)
        if not temperature > 0 or index.shape != logits.shape[:-1]:
            # TRL's error, or (K ids per row) TRL's composition of the two functions above
            return trl_both(*args)
        dtype = out_dtype(logits, index, row_mask)
        if dtype is None:
            return trl_both(*args)
        try:
            lp, ent = token_logprob(logits, targets(index, row_mask), temperature, _SKIP,
                                    return_entropy=True)
        except _REFUSED as e:
            err = e
        else:
            lp, ent = lp.to(dtype), ent.to(dtype)
            return lp, ent if entropy_requires_grad else ent.detach()
        return _trl_after_refusal("selective_log_softmax_and_entropy", trl_both, args, err)

    return {"selective_log_softmax": selective_log_softmax,
            "entropy_from_logits": entropy_from_logits,
            "selective_log_softmax_and_entropy": selective_log_softmax_and_entropy}


# ------------------------------------------------------------------------ patch and undo

class Handle(_patch.Handle):
    """An applied patch: `undo()` (or leaving a `with` block) puts TRL's originals back, also in
    trl modules imported after patch() (they copied the replacement). A second undo does
    nothing. `replacements` maps each replaced name to (TRL's original, ours)."""

    def __init__(self, entropy: bool, replacements: dict[str, tuple[Any, Any]]) -> None:
        super().__init__("trl")
        self.entropy = entropy
        self.replacements = replacements


_ACTIVE: Handle | None = None


def patch(*, entropy: bool = True) -> Handle:
    """Route TRL's log-prob (and, with `entropy`, entropy) computations through the fused ops.

    With entropy=False, entropy_from_logits, selective_log_softmax_and_entropy and fused-head
    calls that ask for entropy stay TRL's; log-prob-only calls use the ops.

    Calling it again while a patch is active returns that patch's handle; with a different
    `entropy` it raises RuntimeError (undo the first one before).

    Raises:
        ImportError: TRL is not installed.
        RuntimeError: a patch with other options is active, or TRL lacks a name this patch
            replaces or consults (a TRL version other than the 1.16 series).
    """
    global _ACTIVE
    if _ACTIVE is not None and _ACTIVE.active:
        if _ACTIVE.entropy == entropy:
            return _ACTIVE
        raise RuntimeError(f"reasonrl_fast.integrations.trl: already patched with "
                           f"entropy={_ACTIVE.entropy}; call undo() on that handle first")
    try:
        utils = importlib.import_module(_UTILS)
        head_module = importlib.import_module(_HEAD[0])
    except ImportError as e:
        raise ImportError(f"reasonrl_fast.integrations.trl needs TRL installed ({e})") from e

    def original(module: Any, name: str) -> Any:
        if not hasattr(module, name):
            raise RuntimeError(f"reasonrl_fast.integrations.trl: {module.__name__}.{name} not "
                               f"found; this patch follows TRL 1.16")
        return getattr(module, name)

    triton, supports = original(utils, "is_triton_available"), original(
        utils, "_supports_trl_loss_kernel")

    def trl_kernel(logits: torch.Tensor, index=None, row_mask=None) -> bool:
        # TRL's own dispatch (trl.trainer.utils), so that the dtypes follow it exactly
        return bool(triton() and supports(logits, index, row_mask))

    orig_head = original(head_module, _HEAD[1])
    names = ("selective_log_softmax", "entropy_from_logits", "selective_log_softmax_and_entropy")
    trl_fns = {n: original(utils, n) for n in names}
    fns = _make_logits_fns(*trl_fns.values(), trl_kernel)
    ours: dict[str, tuple[Any, Any]] = {
        "ChunkedLogProbFunction": (orig_head, _make_head(orig_head, entropy)),
        "selective_log_softmax": (trl_fns["selective_log_softmax"],
                                  fns["selective_log_softmax"]),
    }
    if entropy:
        for n in names[1:]:
            ours[n] = (trl_fns[n], fns[n])
    handle = Handle(entropy, ours)
    for orig, new in ours.values():
        handle.replace(orig, new)
    _ACTIVE = handle
    return _ACTIVE
