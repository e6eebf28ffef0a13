"""Run by tests/models/test_ulysses.py under torchrun (2 CPU ranks, gloo): tiny float64 Qwen2
decoders (4 query heads; 2 key/value heads, which 2 ranks divide, and 1, which they do not) run
packed rows of several sequences whose length 2 does not divide, once whole in this process and
once as Ulysses shares over the two ranks. The hidden states gathered from the ranks must equal the
whole forward's, and the gradients of a loss on them, summed over the ranks, the whole
backward's; prints OK on rank 0."""

import copy
import os
import sys

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from reasonrl_fast.models import ulysses  # noqa: E402
from reasonrl_fast.models.loading import enable_checkpointing  # noqa: E402

def gather_tokens(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Every rank's share of a row concatenated along `dim` (rank order), the same on every
    rank. What follows is computed alike on every rank, so the gradient of a rank's share is its
    own slice of the gathered gradient (not a sum over the ranks)."""
    return _Gather.apply(x, dim, group)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group, ctx.size = dim, group, x.shape[dim]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        rank = dist.get_rank(ctx.group)
        return grad.narrow(ctx.dim, rank * ctx.size, ctx.size), None, None


dist.init_process_group("gloo")
group = dist.group.WORLD
rank = dist.get_rank()
seed = int(os.environ["SEED"])
checked = []
for kv_heads in (2, 1):
    for lengths in ([5, 9, 3], [7], [1, 1, 13, 2]):
        g = torch.Generator().manual_seed(seed + kv_heads + sum(lengths))
        cfg = Qwen2Config(vocab_size=31, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64)
        torch.manual_seed(seed)
        plain = Qwen2Model._from_config(copy.deepcopy(cfg), attn_implementation="sdpa").double()
        sp = Qwen2Model._from_config(copy.deepcopy(cfg), attn_implementation="sdpa").double()  # its own config
        sp.load_state_dict(plain.state_dict())
        ulysses.use_ulysses(sp)
        if kv_heads == 1:  # the layers recomputed in the backward: each attention reads its row again
            enable_checkpointing(sp)
            sp.train()
        ids = torch.randint(3, 31, (1, sum(lengths)), generator=g)
        pos = torch.cat([torch.arange(n) for n in lengths])[None]
        weight = torch.randn(1, sum(lengths), 32, generator=g, dtype=torch.float64)  # the loss: <h, weight>

        h = plain(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state
        (h * weight).sum().backward()

        mine, my_pos, bounds, t = ulysses.shard(ids, pos, group)
        h_mine = sp(input_ids=mine, position_ids=my_pos, use_cache=False, **ulysses.row(group, bounds)).last_hidden_state
        h_all = gather_tokens(h_mine, 1, group)[:, :t]
        (h_all * weight).sum().backward()
        err = (h_all - h).abs().max().item()
        assert err < 1e-10, (kv_heads, lengths, err)
        for (name, a), b in zip(plain.named_parameters(), sp.parameters()):
            grad = b.grad.clone()
            dist.all_reduce(grad)  # each rank's parameters saw its own tokens' share
            scale = a.grad.abs().max().clamp(min=1.0)
            assert ((grad - a.grad).abs().max() / scale).item() < 1e-10, (kv_heads, lengths, name)
        checked.append((kv_heads, tuple(lengths)))
# The actor over a packed row of (prompt, response) pairs: log-probs and entropies of the response
# tokens, the head on each rank's own positions (plain and fused), and log Z from the prompts'
# positions spread over both shares, against the whole row's
from reasonrl_fast.trainer.policy import Actor, make_packed_batch  # noqa: E402

cfg = Qwen2Config(vocab_size=31, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
# (prompt lengths, response lengths): a response whose positions cross from one share into the
# other; a prompt that does (and padding: 15 tokens); three sequences of mixed lengths
ROWS = [((3, 2), (20, 1)), ((10, 2), (2, 1)), ((4, 2, 6), (5, 1, 8))]
for (plens, rlens), (fused, pooling) in zip(ROWS, ((False, "all"), (True, "published"), (True, "all"))):
    g = torch.Generator().manual_seed(seed + len(checked))
    prompts = [[int(x) for x in torch.randint(3, 31, (n,), generator=g)] for n in plens]
    responses = [[int(x) for x in torch.randint(3, 31, (n,), generator=g)] for n in rlens]
    batch = make_packed_batch(prompts, responses, "cpu", one_row=True)
    w = torch.randn(2, *batch["response_mask"].shape, generator=g, dtype=torch.float64)
    wz = torch.randn(len(prompts), generator=g, dtype=torch.float64)
    torch.manual_seed(seed)
    plain, sp = (Actor(Qwen2ForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa"), 2,
                       fused=fused, zhead_pooling=pooling).double().eval() for _ in range(2))  # eval: no dropout
    sp.load_state_dict(plain.state_dict())
    ulysses.use_ulysses(sp.lm)
    sp.sp_group = group
    outs = []
    for actor in (plain, sp):
        lp, ent, z = actor(batch, temperature=0.7, entropy=True, log_z=True)
        ((lp * w[0]).sum() + (ent * w[1]).sum() + (z * wz).sum()).backward()
        outs.append((lp, ent, z))
    for a, b in zip(*outs):
        assert (a - b).abs().max().item() < 1e-10, (plens, (a - b).abs().max().item())
    for (name, a), b in zip(plain.named_parameters(), sp.parameters()):
        grad = b.grad.clone()
        dist.all_reduce(grad)
        assert ((grad - a.grad).abs().max() / a.grad.abs().max().clamp(min=1.0)).item() < 1e-10, (plens, name)
    checked.append(("actor", plens))
if rank == 0:
    print(f"OK {len(checked)} rows: hidden states, log-probs, entropies, log Z and summed gradients equal the whole "
          "forward's")
sys.stdout.flush()
dist.destroy_process_group()
os._exit(0)  # as fsdp_gather_child.py: no interpreter teardown after the group is gone (a gloo thread
# still joinable there aborted a rank that had passed every check: "terminate called without an active exception")
