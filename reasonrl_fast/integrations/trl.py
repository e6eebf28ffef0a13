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
- `add_fused_lm_head`: unchanged, but it first checks the model's config, so that a setting
  the ops cannot reproduce fails when the trainer is built, not at its first step.

Semantics kept (docs/math.md §Token log-prob and entropy, §Fused LM head): the temperature
divides the logits; a logit scale multiplies them (folded into the temperature:
z * s / T = z / (T / s)); the head computes in the autocast dtype when autocast is on, else in
the hidden states' dtype, as TRL's does; rows that `row_mask` zeroes give 0 and no gradient.
Outputs are float32 (TRL's GPU kernels return float32; its CPU fallback returns the logits'
dtype for materialised logits).

Refused with a ValueError that names the setting (the ops have no equivalent, and silently
different numbers would be worse): `final_logit_softcapping` (Gemma-2 style soft-capping), a logit
scale <= 0, and fused-head outputs other than "log_probs" and "entropy" ("log_sum_sq_probs",
"mean_logits", "is_top1").
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch

from reasonrl_fast.ops import linear_token_logprob, token_logprob

# Where TRL defines each name this module replaces.
_HEAD = ("trl.kernels.chunked_logprob", "ChunkedLogProbFunction")
_UTILS = "trl.trainer.utils"
_SUPPORTED_OUTPUTS = ("log_probs", "entropy")
# ignore_index for rows a row_mask skips. TRL never uses it as an id, and an id that is neither a
# valid one nor this value still fails in the op (IndexError), as TRL's own gather would.
_SKIP = -(2**62)


def _check_head_settings(softcap: Optional[float], logit_scale: Optional[float],
                         outputs: Iterable[str], where: str) -> None:
    if softcap is not None:
        raise ValueError(
            f"reasonrl_fast.integrations.trl: {where}: final_logit_softcapping={softcap} is set, "
            f"and the fused ops have no soft-capping; undo the patch (Handle.undo()) to use "
            f"TRL's own head for this model"
        )
    if logit_scale is not None and not logit_scale > 0:
        raise ValueError(
            f"reasonrl_fast.integrations.trl: {where}: logit scale {logit_scale} (logit_scale, "
            f"output_multiplier, lm_head_multiplier or logits_scaling in the model config) must be "
            f"> 0 to be folded into the temperature"
        )
    extra = [o for o in outputs if o not in _SUPPORTED_OUTPUTS]
    if extra:
        raise ValueError(
            f"reasonrl_fast.integrations.trl: {where}: fused-head outputs {extra} are not computed "
            f"by the fused ops (only {list(_SUPPORTED_OUTPUTS)})"
        )


def _make_head(original: type, entropy: bool) -> type:
    """A stand-in for TRL's ChunkedLogProbFunction: same apply() arguments, same five outputs."""

    class ChunkedLogProbFunction:
        """TRL's fused LM head, computed by reasonrl_fast.ops.linear_token_logprob."""

        trl_original = original

        @staticmethod
        def apply(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                  targets: torch.Tensor, temperature: float, chunk_size: int,
                  final_logit_softcapping: Optional[float] = None, logit_scale: float = 1.0,
                  outputs: tuple[str, ...] = ("entropy", "log_sum_sq_probs", "mean_logits",
                                              "is_top1")):
            want_entropy = "entropy" in outputs
            if want_entropy and not entropy:  # patch(entropy=False): entropy stays TRL's
                return original.apply(hidden, weight, bias, targets, temperature, chunk_size,
                                      final_logit_softcapping, logit_scale, outputs)
            _check_head_settings(final_logit_softcapping, logit_scale, outputs,
                                 "ChunkedLogProbFunction.apply")
            if temperature <= 0:
                raise ValueError(f"temperature must be positive, got {temperature}")
            kind = hidden.device.type
            autocast = torch.is_autocast_enabled(kind)
            dtype = torch.get_autocast_dtype(kind) if autocast else hidden.dtype
            # The op takes one dtype for all three; TRL casts the same way before its GEMMs.
            # Autocast is switched off inside so the op's GEMMs stay in that dtype.
            with torch.autocast(kind, enabled=False):
                res = linear_token_logprob(
                    hidden.to(dtype), weight.to(dtype), targets, temperature / logit_scale,
                    ignore_index=_SKIP, bias=None if bias is None else bias.to(dtype),
                    return_entropy=want_entropy,
                )
            lp, ent = res if want_entropy else (res, None)
            return lp.float(), (None if ent is None else ent.float()), None, None, None

    return ChunkedLogProbFunction


def _targets(index: torch.Tensor, row_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The ids, with the rows row_mask zeroes set to the ignored id."""
    return index if row_mask is None else index.masked_fill(row_mask == 0, _SKIP)


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor, temperature: float = 1.0,
                          row_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """TRL's selective_log_softmax (index [...] or [..., K]) with token_logprob."""
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    if index.ndim == logits.ndim:
        # K ids per row: the logits are viewed K times (stride 0, no copy); the op reads the view.
        logits = logits.unsqueeze(-2).expand(*index.shape, logits.shape[-1])
    return token_logprob(logits, _targets(index, row_mask), temperature, _SKIP)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = 128) -> torch.Tensor:
    """TRL's entropy_from_logits with token_logprob (no chunking needed: one pass, no copies)."""
    ids = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    return token_logprob(logits, ids, return_entropy=True)[1]


def selective_log_softmax_and_entropy(
    logits: torch.Tensor, index: torch.Tensor, entropy_requires_grad: bool = True,
    temperature: float = 1.0, row_mask: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's selective_log_softmax_and_entropy: both from one token_logprob pass."""
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    if index.shape != logits.shape[:-1]:
        raise ValueError(f"selective_log_softmax_and_entropy: index shape {tuple(index.shape)} "
                         f"must be the logits shape {tuple(logits.shape)} without its last dim")
    lp, ent = token_logprob(logits, _targets(index, row_mask), temperature, _SKIP,
                            return_entropy=True)
    return lp, ent if entropy_requires_grad else ent.detach()


def _checked_add_fused_lm_head(original: Callable, entropy: bool) -> Callable:
    """TRL's add_fused_lm_head, refusing at once what the patched head would refuse per step."""
    sig = inspect.signature(original)

    @functools.wraps(original)
    def add_fused_lm_head(*args: Any, **kwargs: Any) -> None:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        model, outputs = bound.arguments["model"], tuple(bound.arguments["outputs"])
        if entropy or "entropy" not in outputs:
            config = model.config.get_text_config()
            name = type(model).__name__
            _check_head_settings(getattr(config, "final_logit_softcapping", None), None, outputs,
                                 f"add_fused_lm_head({name})")
        return original(*args, **kwargs)

    add_fused_lm_head.trl_original = original  # type: ignore[attr-defined]
    return add_fused_lm_head


def _trl_modules() -> list[Any]:
    return [m for n, m in list(sys.modules.items())
            if m is not None and (n == "trl" or n.startswith("trl."))]


def _swap(pairs: dict[int, tuple[Any, Any]]) -> int:
    """In every loaded trl.* module, set each attribute that is `old` to `new` ({id(old): (old,
    new)}); returns how many attributes changed."""
    n = 0
    for module in _trl_modules():
        d = getattr(module, "__dict__", {})
        for attr, value in list(d.items()):
            hit = pairs.get(id(value))
            if hit is not None and hit[0] is value:
                setattr(module, attr, hit[1])
                n += 1
    return n


@dataclass
class Handle:
    """An applied patch: `undo()` (or leaving a `with` block) puts TRL's originals back."""

    entropy: bool
    replacements: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # name: (orig, ours)
    active: bool = True

    def undo(self) -> None:
        """Restore the originals wherever a replacement is bound, including trl modules
        imported after patch() (they copied the replacement). A second call does nothing."""
        global _ACTIVE
        if not self.active:
            return
        _swap({id(ours): (ours, orig) for orig, ours in self.replacements.values()})
        self.active = False
        if _ACTIVE is self:
            _ACTIVE = None

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


_ACTIVE: Optional[Handle] = None


def patch(*, entropy: bool = True) -> Handle:
    """Route TRL's log-prob (and, with `entropy`, entropy) computations through the fused ops.

    With entropy=False, entropy_from_logits, selective_log_softmax_and_entropy and fused-head
    calls that ask for entropy stay TRL's; log-prob-only calls use the ops.

    Calling it again while a patch is active returns that patch's handle; with a different
    `entropy` it raises RuntimeError (undo the first one before).

    Raises:
        ImportError: TRL is not installed.
        RuntimeError: a patch with other options is active, or TRL lacks a name this patch
            replaces (a TRL version other than the 1.16 series).
    """
    global _ACTIVE
    if _ACTIVE is not None:
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

    orig_head = original(head_module, _HEAD[1])
    orig_add = original(utils, "add_fused_lm_head")
    ours: dict[str, tuple[Any, Any]] = {
        "ChunkedLogProbFunction": (orig_head, _make_head(orig_head, entropy)),
        "add_fused_lm_head": (orig_add, _checked_add_fused_lm_head(orig_add, entropy)),
        "selective_log_softmax": (original(utils, "selective_log_softmax"),
                                  selective_log_softmax),
    }
    if entropy:
        ours["entropy_from_logits"] = (original(utils, "entropy_from_logits"),
                                       entropy_from_logits)
        ours["selective_log_softmax_and_entropy"] = (
            original(utils, "selective_log_softmax_and_entropy"), selective_log_softmax_and_entropy)
    _swap({id(orig): (orig, new) for orig, new in ours.values()})
    _ACTIVE = Handle(entropy=entropy, replacements=ours)
    return _ACTIVE
