"""The trained module: the causal LM plus (FlowRL) the Z-head, under one root so FSDP2 shards
and gathers them together, and the batch layout that turns (prompt, response) id lists into
tensors. Log-probs and entropies come from the fused ops: `linear_token_logprob` straight from
the final hidden states (`fused`), else `token_logprob` on the response positions' logits."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from reasonrl_fast.models import ulysses
from reasonrl_fast.models.lm_head import check_trainable, decoder_of, head_blocker, head_of
from reasonrl_fast.ops import ZHead, linear_token_logprob, token_logprob


class Actor(nn.Module):
    """`lm` is a Hugging Face causal LM of any layout: its decoder and output layer are found
    through transformers' API (models/lm_head.py `decoder_of`, `head_of`), and a model without
    them is refused here, in one line. `proj_z` (FlowRL) is attached before sharding so the
    same optimiser trains it and the TB loss reaches the backbone through log Z
    (docs/math.md §Z-head). `fused`: log-probs from the hidden states and the head weight,
    without logits (only for a plain linear head, see models/lm_head.py)."""

    def __init__(self, lm: nn.Module, zhead_layers: int = 0, fused: bool = False, zhead_pooling: str = "all"):
        super().__init__()
        check_trainable(lm)
        self.lm = lm
        # In the LM's dtype: FSDP2 asks one dtype of every parameter a group holds, and the root
        # group holds the Z-head with the embeddings and the head (verl casts the actor after
        # adding it, likewise). Built in float32 and then cast, as verl's is.
        dtype = next(lm.parameters()).dtype
        self.proj_z = (ZHead(lm.config.hidden_size, num_layers=zhead_layers, pooling=zhead_pooling).to(dtype)
                       if zhead_layers else None)
        blocker = head_blocker(lm)
        if fused and blocker is not None:
            raise ValueError(f"Actor(fused=True): {blocker}")
        self.fused = fused
        # A head whose logits the model's forward changes (soft-cap, scale) is run through that
        # forward, so the unfused log-probs are the model's own.
        self.plain_head = blocker is None
        # Ulysses sequence parallel (models/ulysses.py): the process group a packed row is cut
        # over, set by the worker; None runs each row whole.
        self.sp_group = None

    # Looked up on each use, not stored: a sub-module assigned here would be registered twice
    # (under `lm.` and its own name) in the state dict, the checkpoints and FSDP's units.
    @property
    def decoder(self) -> nn.Module:
        return decoder_of(self.lm)

    @property
    def head(self) -> nn.Module:
        return head_of(self.lm)

    def forward(self, batch: dict, temperature: float = 1.0, entropy: bool = False, log_z: bool = False):
        """Returns (logprob [B, R], entropy [B, R] or None, log_z [B] or None) for the response
        tokens of `batch` (padded: `make_batch`, packed: `make_packed_batch`); 0 past a
        response's end."""
        if batch.get("packed"):
            if self.sp_group is not None:
                return self._sequence_parallel(batch, temperature, entropy, log_z)
            return self._packed(batch, temperature, entropy, log_z)
        p = batch["prompt_len"]
        targets = batch["targets"]
        if self.plain_head:
            h = self._hidden(batch)
            hr = h[:, p - 1:-1]  # only the positions that predict response tokens
            if self.fused:
                # Inside the root's forward FSDP2 has unsharded the head: a plain tensor here
                # (the tied embedding when there is one), whose gradient FSDP reduces as usual.
                w = self.head.weight
                if hasattr(w, "full_tensor"):
                    raise RuntimeError("fused LM head: lm_head.weight is still sharded in the "
                                       "forward; shard the head with the root module")
                res = linear_token_logprob(hr, w, targets, temperature=temperature,
                                           return_entropy=entropy)
            else:
                res = token_logprob(self.head(hr), targets, temperature=temperature,
                                    return_entropy=entropy)
        else:
            h, logits = self._model_logits(batch, targets.shape[1])
            res = token_logprob(logits, targets, temperature=temperature, return_entropy=entropy)
        lp, ent = (res if entropy else (res, None))
        z = self.proj_z(h, batch["prompt_mask"]) if (log_z and self.proj_z is not None) else None
        return lp, ent, z

    def _packed(self, batch: dict, temperature: float, entropy: bool, log_z: bool):
        """The packed rows' forward: the head runs on the positions that predict response tokens
        only (gathered from the rows), and their log-probs are scattered back into the padded
        [B, R] layout the losses read."""
        mask = batch["response_mask"].bool()
        at = batch["response_index"][mask]  # row positions predicting the real response tokens
        targets = batch["targets"][mask]
        if self.plain_head:
            h = self._hidden(batch).flatten(0, 1)  # the rows end to end
            if self.fused:
                res = linear_token_logprob(h[at], self.head.weight, targets, temperature=temperature,
                                           return_entropy=entropy)
            else:
                res = token_logprob(self.head(h[at]), targets, temperature=temperature,
                                    return_entropy=entropy)
        else:
            h, logits = self._model_logits(batch, 0)  # logits of every row position
            h = h.flatten(0, 1)
            res = token_logprob(logits.flatten(0, 1)[at], targets, temperature=temperature, return_entropy=entropy)
        lp, ent = (res if entropy else (res, None))
        lp = lp.new_zeros(mask.shape).masked_scatter(mask, lp)
        ent = ent.new_zeros(mask.shape).masked_scatter(mask, ent) if ent is not None else None
        z = None
        if log_z and self.proj_z is not None:
            z = self.proj_z(h[batch["prompt_index"]], batch["prompt_mask"])
        return lp, ent, z

    def _sequence_parallel(self, batch: dict, temperature: float, entropy: bool, log_z: bool):
        """`_packed` with the row cut over the sequence-parallel group: the decoder runs on this
        rank's share (attention over the whole row, models/ulysses.py), the head on the response
        positions within it, and the ranks' log-probs are summed into the whole [B, R] on every
        rank. Each parameter's gradient on a rank is then its share's, and summed over the group
        the whole's (the gradient reduction sums them)."""
        if not self.plain_head:
            raise NotImplementedError("sequence parallel needs a plain linear head (models/lm_head.py)")
        if batch["input_ids"].shape[0] != 1:
            raise ValueError("sequence parallel takes one packed row (make_packed_batch(one_row=True))")
        group = self.sp_group
        ids, pos, bounds, _ = ulysses.shard(batch["input_ids"], batch["position_ids"], group)
        h = self.decoder(input_ids=ids, position_ids=pos, use_cache=False,
                         **ulysses.row(group, bounds)).last_hidden_state[0]
        first = dist.get_rank(group) * h.shape[0]
        mask = batch["response_mask"].bool()
        at, targets = batch["response_index"][mask] - first, batch["targets"][mask]
        here = (at >= 0) & (at < h.shape[0])  # the response positions in this rank's share
        if self.fused:
            res = linear_token_logprob(h[at[here]], self.head.weight, targets[here], temperature=temperature,
                                       return_entropy=entropy)
        else:
            res = token_logprob(self.head(h[at[here]]), targets[here], temperature=temperature,
                                return_entropy=entropy)
        lp, ent = (res if entropy else (res, None))

        def whole(x):  # this rank's values in the [B, R] layout, then every rank's
            return ulysses.sum_shares(x.new_zeros(mask.shape).masked_scatter(mask, x.new_zeros(at.shape)
                                                                                  .masked_scatter(here, x)), group)
        z = self._log_z_shared(h, first, batch) if log_z and self.proj_z is not None else None
        return whole(lp), whole(ent) if ent is not None else None, z

    def _log_z_shared(self, h: torch.Tensor, first: int, batch: dict) -> torch.Tensor:
        """log Z over a row cut across the group: each rank sums the pooled prompt positions in its
        share, the sums are added up, and every rank runs the head on the mean; only the group's
        first rank gives the head's parameters their gradient (summed over the group, it is then
        counted once). The head's dropout must draw alike on every rank: the worker seeds the
        ranks of a group alike before an update (worker.py `train_step`)."""
        group = self.sp_group
        pooled = self.proj_z.pooled_positions(batch["prompt_mask"]).bool()  # [B, P]
        where = batch["prompt_index"] - first
        inside = pooled & (where >= 0) & (where < h.shape[0])
        rows = torch.arange(pooled.shape[0], device=h.device)[:, None].expand_as(pooled)[inside]
        part = h.new_zeros(pooled.shape[0], h.shape[-1]).index_add(0, rows, h[where[inside]])
        mean = ulysses.sum_shares(part, group) / pooled.sum(-1, keepdim=True).to(h.dtype)
        return self.proj_z.from_pooled(mean, own_gradient=dist.get_rank(group) == 0)

    def _hidden(self, batch: dict) -> torch.Tensor:
        """Final hidden states (after the last norm), from the decoder, without running the head."""
        # A packed row has no attention mask: transformers then builds the block-diagonal one
        # (or flash-attn's variable-length boundaries) from the restarting position ids.
        out = self.decoder(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                           position_ids=batch["position_ids"], use_cache=False)
        return out.last_hidden_state

    def _model_logits(self, batch: dict, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(final hidden states, logits of the positions predicting the r response tokens) from
        the causal LM's own forward, so its logit transforms apply; the hidden states are caught
        on the way out of the decoder (the Z-head reads them)."""
        caught = {}

        def hook(_module, _args, out):
            caught["h"] = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

        handle = self.decoder.register_forward_hook(hook)
        try:
            out = self.lm(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                          position_ids=batch["position_ids"], use_cache=False, logits_to_keep=r + 1 if r else 0)
        finally:
            handle.remove()
        return caught["h"], (out.logits[:, :-1] if r else out.logits)


def response_mask(targets: torch.Tensor, masks: list[list[int]] | None) -> torch.Tensor:
    """[B, R] float: 1 on the policy's response tokens, 0 on padding and, where `masks` gives a
    sample's (multi-turn samples, rollout/turns.py), on its tool observations' tokens: what every
    loss, KL, entropy and log-prob diagnostic sums over."""
    mask = (targets != -100).float()
    if masks:
        for b, m in enumerate(masks):
            if m:
                mask[b, :len(m)] *= torch.tensor(m, dtype=mask.dtype)
    return mask


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int, device,
               masks: list[list[int]] | None = None) -> dict:
    """[left-padded prompt | right-padded response]; `targets` are the response ids with -100 on
    padding, `response_mask` marks the policy's response tokens (`response_mask`: `masks` leaves
    out tool observations), `prompt_mask` real prompt tokens."""
    p = max(len(x) for x in prompts)
    r = max(1, max(len(x) for x in responses))
    # rows built as lists and converted once: a tensor per row is slower (benchmarks/RESULTS.md §9)
    ids = torch.tensor([[pad_id] * (p - len(pr)) + list(pr) + list(rs) + [pad_id] * (r - len(rs))
                        for pr, rs in zip(prompts, responses)], dtype=torch.long)
    attn = torch.tensor([[0] * (p - len(pr)) + [1] * (len(pr) + len(rs)) + [0] * (r - len(rs))
                         for pr, rs in zip(prompts, responses)], dtype=torch.long)
    targets = torch.tensor([list(rs) + [-100] * (r - len(rs)) for rs in responses], dtype=torch.long)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    prompt_mask = attn.clone()
    prompt_mask[:, p:] = 0
    batch = {"input_ids": ids, "attention_mask": attn, "position_ids": position_ids,
             "targets": targets, "response_mask": response_mask(targets, masks), "prompt_mask": prompt_mask}
    batch = {k: v.to(device) for k, v in batch.items()}
    batch["prompt_len"] = p
    return batch


def make_packed_batch(prompts: list[list[int]], responses: list[list[int]], device, pad_id: int = 0,
                      one_row: bool = True, masks: list[list[int]] | None = None) -> dict:
    """The sequences (prompt + response) concatenated into rows with position ids that restart at
    0 for each, so no padded token enters a sequence's attention. `one_row`: all in one row [1, T]
    (flash-attn's variable-length kernels cost each sequence only its own length). Else rows as
    long as the longest sequence, filled longest first (first fit), their tails padded as blocks
    of their own: attention through a block-diagonal mask (sdpa, eager) costs each row its full
    length squared, so a row no longer than the padded layout's keeps it at most the padded
    cost. `targets`/`response_mask` keep the padded [B, R] layout of `make_batch`;
    `response_index` [B, R] is the position (in the rows laid end to end) that predicts each
    response token, `prompt_index`/`prompt_mask` [B, P] the prompt's positions."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    width = sum(lengths) if one_row else max(lengths)
    rows: list[list[int]] = []  # sequence indices per row, first fit by decreasing length
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        j = next((j for j, r in enumerate(room) if r >= lengths[i]), None)
        if j is None:
            rows.append([])
            room.append(width)
            j = len(rows) - 1
        rows[j].append(i)
        room[j] -= lengths[i]
    width = max(width - min(room), 1)  # the fullest row's length
    ids, pos = [], []
    resp_at: list[list[int]] = [[] for _ in lengths]
    prompt_at: list[list[int]] = [[] for _ in lengths]
    for row in rows:
        for i in row:
            start, pr, rs = len(ids), prompts[i], responses[i]
            ids += list(pr) + list(rs)
            pos += range(lengths[i])
            resp_at[i] = [start + len(pr) - 1 + t for t in range(len(rs))]
            prompt_at[i] = list(range(start, start + len(pr)))
        tail = (-len(ids)) % width
        ids += [pad_id] * tail
        pos += range(tail)
    r = max(1, max(len(x) for x in responses))
    p = max(len(x) for x in prompts)
    targets = torch.tensor([list(rs) + [-100] * (r - len(rs)) for rs in responses], dtype=torch.long)
    batch = {"input_ids": torch.tensor(ids, dtype=torch.long).view(-1, width),
             "position_ids": torch.tensor(list(pos), dtype=torch.long).view(-1, width),
             "targets": targets, "response_mask": response_mask(targets, masks),
             "response_index": torch.tensor([a + [0] * (r - len(a)) for a in resp_at], dtype=torch.long),
             "prompt_index": torch.tensor([a + [0] * (p - len(a)) for a in prompt_at], dtype=torch.long),
             "prompt_mask": torch.tensor([[1] * len(a) + [0] * (p - len(a)) for a in prompt_at], dtype=torch.long)}
    batch = {k: v.to(device) for k, v in batch.items()}
    batch["packed"] = True
    return batch
