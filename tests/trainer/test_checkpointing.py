"""Activation checkpointing (model.gradient_checkpointing): the same gradients in float64, with
far fewer tensors kept from the forward for the backward."""

import pytest
import torch

from reasonrl_fast.models.loading import enable_checkpointing
from reasonrl_fast.trainer.policy import Actor, make_batch, make_packed_batch
from tests.trainer.test_packing import random_samples, tiny


def saved_and_grads(actor, batch):
    saved = []

    def keep(t):
        saved.append(t.numel() * t.element_size())
        return t

    actor.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        lp, ent, z = actor(batch, 0.9, entropy=True, log_z=True)
    (lp.sum() + ent.sum() + z.sum()).backward()
    return sum(saved), {n: p.grad.clone() for n, p in actor.named_parameters()}


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("fused", [False, True])
def test_checkpointing_keeps_gradients_and_drops_activations(packed, fused):
    prompts, responses = random_samples(8)
    batch = make_packed_batch(prompts, responses, "cpu", 0, one_row=False) if packed else make_batch(prompts, responses, 0, "cpu")
    lm = tiny("qwen2", num_hidden_layers=4)
    actor = Actor(lm, 2, fused=fused).double()
    actor.train()
    actor.proj_z.eval()  # no dropout: both passes must see the same function
    plain_bytes, plain = saved_and_grads(actor, batch)
    enable_checkpointing(lm)
    ckpt_bytes, ckpt = saved_and_grads(actor, batch)
    for name, g in plain.items():
        torch.testing.assert_close(ckpt[name], g, rtol=1e-12, atol=1e-14, msg=name)
    # per layer only its input is kept (the recompute saves the rest during the backward)
    assert ckpt_bytes < plain_bytes / 3, (ckpt_bytes, plain_bytes)
