"""The `hf` engine's sampler (rollout/hf.py): a Hugging Face causal LM sampled with its KV cache
(`sample`), on every device and model.

Sampling draws each row's token by the Gumbel-max rule from noise that is a pure function of the
row's seed, the position and the token id (`gumbel_noise`): a row's sample depends on its seed
only, whatever else is in the batch, so one seed gives the same sample at any worker count."""

from __future__ import annotations

import inspect
from typing import Callable

import numpy as np
import torch

from reasonrl_fast.rollout.base import GREEDY_BELOW
from reasonrl_fast.rollout.lean import LeanDecoder


def _int64(x: int) -> int:
    """A 64-bit constant as the signed int64 torch stores (arithmetic wraps modulo 2**64)."""
    return x - (1 << 64) if x >= 1 << 63 else x


_GAMMA, _M1, _M2 = _int64(0x9E3779B97F4A7C15), _int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB)


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser: a bijection of int64 whose output bits all depend on every input
    bit (Steele, Lea, Flood 2014)."""
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return z ^ _shr(z, 31)


def _mix_(z: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """`_mix` of int64 `z` in place (`scratch`: a tensor of z's shape and dtype to overwrite): the
    same values without a new [B, V] tensor per operation, whose allocation (fresh pages from the
    system) cost more than the arithmetic."""
    for k, m in ((30, _M1), (27, _M2), (31, None)):
        torch.bitwise_right_shift(z, k, out=scratch)
        z.bitwise_xor_(scratch.bitwise_and_((1 << (64 - k)) - 1))
        if m is not None:
            z.mul_(m)
    return z


def gumbel_noise(seeds: torch.Tensor, t: int, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise [B, V] (float64) for position t of rows seeded `seeds` [B] (int64):
    a SplitMix64 stream per row, so the noise of a row is the same in any batch. Computed in place
    (the values bit for bit those of one new tensor per operation, and faster over a large
    vocabulary: benchmarks/RESULTS.md §19)."""
    ids = torch.arange(1, vocab + 1, device=seeds.device).add_(t * vocab).mul_(_GAMMA)
    state = ids.expand(seeds.shape[0], vocab).add(_mix(seeds)[:, None])
    scratch = torch.empty_like(state)
    z = _mix_(state, scratch)
    bits = torch.bitwise_right_shift(z, 11, out=scratch).bitwise_and_((1 << 53) - 1)
    u = bits.double().add_(0.5).div_(2.0**53)  # 53 random bits, strictly inside (0, 1)
    return u.log_().neg_().log_().neg_()


def _keep_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits outside the smallest set of tokens whose probability reaches top_p set to -inf
    (the most likely token always stays; tokens tied with the last one kept stay too). Only the
    sorted values are needed, not the order: the set is every logit at or above the last kept
    one. On CPU numpy sorts them (its SIMD sort, faster than torch.sort's values and indices:
    benchmarks/RESULTS.md §19)."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        desc = torch.from_numpy(np.sort(logits.detach().numpy(), axis=-1)[..., ::-1].copy())
    else:
        desc = logits.sort(dim=-1, descending=True).values
    probs = desc.softmax(-1)
    reached = probs.cumsum(-1) - probs >= top_p  # the mass before this token already reaches top_p
    # the first token past the set (none: all stay); the first token's mass before is 0, so it stays
    kept = torch.where(reached.any(-1), reached.int().argmax(-1), reached.shape[-1])
    return logits.masked_fill(logits < desc.gather(-1, kept[..., None] - 1), float("-inf"))


def hf_stepper(model, ids: torch.Tensor, attn: torch.Tensor) -> Callable:
    """`LeanDecoder.stepper` through the model's own forward and a `DynamicCache`: called with
    None, the next-token logits [B, V] after the left-padded prompts; called with the tokens just
    chosen [B], the logits after them."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older transformers
        cache = DynamicCache()
    # transformers renamed `past_key_values` to `cache` (5.x); take whichever this model has
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    state = {"attn": attn, "pos": pos[:, -1:]}

    def step(tok: torch.Tensor | None) -> torch.Tensor:
        if tok is None:
            out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1,
                        **{kw: cache})
        else:
            state["attn"] = torch.cat([state["attn"], torch.ones_like(attn[:, :1])], 1)
            state["pos"] = state["pos"] + 1
            out = model(input_ids=tok[:, None], attention_mask=state["attn"], position_ids=state["pos"],
                        use_cache=True, **{kw: cache})
        return out.logits[:, -1, :]

    return step


# No autograd bookkeeping at all: faster than no_grad (benchmarks/RESULTS.md §9).
@torch.inference_mode()
def sample(model, ids: torch.Tensor, attn: torch.Tensor, temperature: float, top_p: float,
           max_new_tokens: int | torch.Tensor,
           eos_id: int, pad_id: int, lean: LeanDecoder | None = None, seeds: torch.Tensor | None = None,
           between_tokens: Callable[[int], bool] | None = None,
           stop: Callable[[list[int]], list[bool]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Ancestral sampling from a Hugging Face causal LM with its KV cache: ([B, <= max_new_tokens]
    new tokens for the left-padded `ids`, pad after a row's EOS, stopping once every row has ended;
    each token's log-prob [B, same] under the distribution it was drawn from, 0 after the row's
    end and for greedy choices). `seeds` [B] int64: each row's sampling seed (drawn from torch's
    global generator when None). The same distribution as `generate(do_sample=True, temperature,
    top_p, top_k=0)`, without its per-token logits processors and stopping criteria: faster, and
    faster again through `lean` (the same model run by a LeanDecoder; benchmarks/RESULTS.md §9).
    The outputs are inference-mode tensors (no autograd). `max_new_tokens` [B]: a limit per row
    (the longest sets the width; a row is padded after its own).

    `between_tokens(t)`, asked before token t >= 1 is computed, True when the model's weights
    changed there (rollout/handoff.py): the cache is then recomputed under the new weights from
    the prompt and the tokens so far, so that token t on is drawn from the new policy exactly, not
    from new weights over an old cache.

    `stop(tokens)`, given each row's newest token, says which rows end there besides EOS (a turn
    that ends with a tool call: rollout/turns.py `StopStrings`, which keeps where); their token is
    kept."""

    def stepper(ids: torch.Tensor, attn: torch.Tensor, steps: int) -> Callable:
        return lean.stepper(ids, attn, steps) if lean is not None else hf_stepper(model, ids, attn)

    limits = None
    if isinstance(max_new_tokens, torch.Tensor):
        limits, max_new_tokens = max_new_tokens.to(ids.device), int(max_new_tokens.max())
    step = stepper(ids, attn, max_new_tokens)
    if seeds is None:
        seeds = torch.randint(0, 2**62, (ids.shape[0],))
    seeds = seeds.to(device=ids.device, dtype=torch.long)
    logits = step(None)
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    new, lps = [], []
    for t in range(max_new_tokens):
        logits = logits.float()
        if temperature < GREEDY_BELOW:
            tok = logits.argmax(-1)
            lp = torch.zeros(tok.shape, device=logits.device)
        else:
            logits = logits / temperature
            if top_p < 1.0:
                logits = _keep_top_p(logits, top_p)
            tok = gumbel_noise(seeds, t, logits.shape[-1]).add_(logits).argmax(-1)
            lp = logits.log_softmax(-1).gather(-1, tok[:, None]).squeeze(1)
        tok = tok.masked_fill(done, pad_id)
        new.append(tok)
        lps.append(lp.masked_fill(done, 0.0))
        ended = tok == eos_id
        if stop is not None:
            ended |= torch.tensor(stop(tok.tolist()), dtype=torch.bool, device=tok.device) & ~done
        done |= ended
        if limits is not None:
            done |= limits <= t + 1
        if t + 1 == max_new_tokens or bool(done.all()):
            break
        if between_tokens is not None and between_tokens(t + 1):
            grown = torch.cat([attn, torch.ones_like(attn[:, :1]).expand(-1, t + 1)], 1)
            step = stepper(torch.cat([ids, torch.stack(new, 1)], 1), grown, max_new_tokens - t - 1)
            logits = step(None)
        else:
            logits = step(tok)
    if not new:
        return ids.new_zeros(ids.shape[0], 0), torch.zeros(ids.shape[0], 0, device=ids.device)
    return torch.stack(new, 1), torch.stack(lps, 1)
