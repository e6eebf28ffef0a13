"""One worker's share of a mini-batch update, as micro-batches: which samples go in which forward
(`plan`, the only collective), their tensors (`micro_batch`), and the gradient accumulation
(`accumulate`). The worker (worker.py) strings them together and steps the optimiser.

The normalisation is the mini-batch's, not the micro-batch's or the worker's: a loss that is a
mean over units (tokens for token-mean, sequences for the sequence means and FlowRL) is, for one
micro-batch, its own mean times its share of the mini-batch's units over every micro-batch and
every worker. Summed over micro-batches and averaged over workers by the data-parallel reduction
(hence x world), the gradient is exactly the one of the mean over the whole mini-batch in one
process (docs/trainer.md §Memory)."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from reasonrl_fast.algos.correction import gap_sums, rollout_weights
from reasonrl_fast.layout.micro import split
from reasonrl_fast.trainer.policy import make_batch, make_packed_batch


def units(responses, idx, kind: str, masks=None) -> float:
    """The loss units of samples `idx`: their response tokens the policy sampled ("tokens": a
    multi-turn sample's `masks` leave out its tool observations) or their count."""
    if kind != "tokens":
        return float(len(idx))
    return float(sum(sum(masks[i]) if masks and masks[i] else len(responses[i]) for i in idx))


def plan(prompts, responses, chunks: list[slice], budget: int, packed: bool, kind: str, world: int,
         device, sp: int = 1, masks=None) -> tuple[list[list[list[int]]], list[float]]:
    """The micro-batches of each mini-batch `chunks` (lists of sample indices) and each
    mini-batch's loss units over all workers. One all-gather of every worker's fewest micro-batches
    and units per mini-batch: all run the largest count (FSDP's gathers are collectives: every
    worker must run as many forwards), each balancing its own sequences into that many. `sp`: the
    sequence-parallel group's size, whose ranks hold the same samples (counted once)."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    mine = torch.tensor([[len(split(lengths[c], budget, packed)), units(responses, range(c.start, c.stop), kind, masks)]
                         for c in chunks], dtype=torch.float64)
    if world > 1:
        everyone = [torch.empty_like(mine, device=device) for _ in range(world)]
        dist.all_gather(everyone, mine.to(device))
        everyone = torch.stack(everyone).cpu()
        counts, totals = everyone[..., 0].amax(0), everyone[..., 1].sum(0) / sp
    else:
        counts, totals = mine[:, 0], mine[:, 1]
    micros = [[[c.start + i for i in g] for g in split(lengths[c], budget, packed, int(k))]
              for c, k in zip(chunks, counts.tolist())]
    return micros, [max(float(t), 1.0) for t in totals]


def micro_batch(prompts, responses, rollout_lps, idx, packed: bool, pad_id: int, device,
                one_row: bool = False, masks=None) -> tuple[dict, torch.Tensor]:
    """One micro-batch's tensors (packed, in one row or several, or padded) and its sampler
    log-probs [B, R]. An empty micro-batch (a worker with fewer sequences than forwards) stands
    in with sample 0, which `accumulate` weighs 0. `masks`: multi-turn samples' policy-token
    masks (None: every response token is the policy's)."""
    idx = idx or [0]
    ps, rs = [prompts[i] for i in idx], [responses[i] for i in idx]
    ms = [masks[i] for i in idx] if masks else None
    batch = (make_packed_batch(ps, rs, device, pad_id, one_row, ms) if packed
             else make_batch(ps, rs, pad_id, device, ms))
    width = batch["targets"].shape[1]
    lp = torch.tensor([rollout_lps[i] + [0.0] * (width - len(rollout_lps[i])) for i in idx], device=device)
    return batch, lp


@torch.no_grad()
def logprobs(model, batches, temperature: float) -> list[list[torch.Tensor]]:
    """Log-probs [B, R] of every micro-batch of every mini-batch (the old or reference pass)."""
    return [[model(batch, temperature)[0] for batch, _ in micros] for micros in batches]


def accumulate(model, algo, cfg, responses, idxs, batches, adv, total: float, world: int,
               old_lps=None, ref_lps=None, sp: int = 1, masks=None) -> tuple[dict[str, float], list[dict]]:
    """Forward and backward of one mini-batch's micro-batches (`idxs`, `batches`) through `model`
    (the actor, or its DDP wrapper), gradients left summed in the parameters' .grad. `total`: the
    mini-batch's loss units over all workers. Returns the mini-batch's stats (each weighted by its
    micro-batch's share, x world: the driver's mean over workers is the mini-batch's mean) and the
    rollout-gap sums of algos/correction.py. `sp`: the sequence-parallel group's size. Its ranks
    compute the same loss, each backward reaching its share of the rows' tokens, so the gradients
    summed over all workers are the mini-batch's as they are; their stats are counted once."""
    kind = algo.loss_units(cfg)
    stats: dict[str, float] = {}
    sums: list[dict] = []
    for j, (idx, (batch, rollout_lp)) in enumerate(zip(idxs, batches)):
        mask = batch["response_mask"]
        share = units(responses, idx, kind, masks) / total * world
        with _no_sync(model, last=j == len(idxs) - 1):
            lp, ent, log_z = model(batch, cfg.rollout.temperature, entropy=True, log_z=algo.zhead)
            old = old_lps[j] if old_lps is not None else lp.detach()
            ref = ref_lps[j] if ref_lps is not None else None
            weight, wsums = rollout_weights(old, rollout_lp, mask, cfg.rollout.correction, cfg.rollout.is_cap,
                                            per_sequence=algo.per_sequence)
            loss, st = algo.loss(cfg, lp, old, ref, adv[idx or [0]], mask, log_z, weight, ent)
            (loss * share).backward()
        if idx:
            sums.append({**gap_sums(old, rollout_lp, mask), **{"w_" + k: v for k, v in wsums.items()}})
        st["train/loss"] = float(loss.detach())
        st["entropy/mean"] = float((ent.detach() * mask).sum() / mask.sum().clamp(min=1))
        for key, v in st.items():
            stats[key] = stats.get(key, 0.0) + v * share / sp
    return stats, sums


def _no_sync(model, last: bool):
    """DDP all-reduces the gradients once, in the mini-batch's last backward (they add up locally
    before it); FSDP2 reduce-scatters each backward into the sharded gradients."""
    if not last and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()
