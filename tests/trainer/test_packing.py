"""Packed rows (one row per micro-batch, position ids restarting per sequence, no attention mask)
against the padded layout, in float64: log-probs, entropies, log Z and every gradient, for each
model family the packing is on for (layout/ PACKED_FAMILIES)."""

import random

import pytest
import torch
import transformers

from reasonrl_fast.errors import ConfigError
from reasonrl_fast import layout
from reasonrl_fast.layout import PACKED_FAMILIES
from reasonrl_fast.trainer.policy import Actor, make_batch, make_packed_batch

CONFIGS = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig,
           "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig}


def tiny(family: str, **extra):
    kw = dict(vocab_size=37, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    if family == "mistral":
        kw["sliding_window"] = None
    kw.update(extra)
    return transformers.AutoModelForCausalLM.from_config(CONFIGS[family](**kw), attn_implementation="sdpa").double()


def run(actor, batch):
    actor.zero_grad(set_to_none=True)
    lp, ent, z = actor(batch, 0.7, entropy=True, log_z=True)
    g = torch.randn_like(lp)  # an arbitrary upstream gradient, the same for both layouts
    ((lp * g).sum() + 0.3 * ent.sum() + z.sum()).backward()
    return lp.detach(), ent.detach(), z.detach(), {n: p.grad.clone() for n, p in actor.named_parameters()}


def check_same(actor, prompts, responses, one_row):
    torch.manual_seed(1)
    padded = run(actor, make_batch(prompts, responses, 0, "cpu"))
    torch.manual_seed(1)
    packed = run(actor, make_packed_batch(prompts, responses, "cpu", 0, one_row))
    for a, b in zip(padded[:3], packed[:3]):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for name, g in padded[3].items():
        torch.testing.assert_close(g, packed[3][name], rtol=1e-10, atol=1e-12, msg=name)


def random_samples(b=6):
    rng = random.Random(torch.initial_seed())
    prompts = [[rng.randint(3, 36) for _ in range(rng.randint(1, 7))] for _ in range(b)]
    responses = [[rng.randint(3, 36) for _ in range(rng.randint(0, 10))] for _ in range(b)]
    responses[0] = responses[0] or [4]  # at least one response token in the batch
    return prompts, responses


@pytest.mark.parametrize("one_row", [True, False])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_packed_rows_equal_padded_rows(family, fused, one_row):
    assert family in PACKED_FAMILIES
    lm = tiny(family)
    actor = Actor(lm, 2, fused=fused).double().eval()  # eval: no Z-head dropout
    check_same(actor, *random_samples(), one_row)


@pytest.mark.parametrize("one_row", [True, False])
def test_packed_rows_equal_padded_rows_with_the_published_zhead_pooling(one_row):
    """The Z-head pooling all prompt positions but the last (flowrl.zhead_pooling=published) in
    both layouts: the same log Z and gradients."""
    actor = Actor(tiny("qwen2"), 2, zhead_pooling="published").double().eval()
    check_same(actor, *random_samples(), one_row)


@pytest.mark.parametrize("one_row", [True, False])
def test_packed_rows_through_the_models_own_head(one_row):
    """A head the model's forward transforms (here a biased LM head) runs the full forward on the
    packed rows; the response positions are gathered from its logits."""
    lm = tiny("qwen2")
    lm.lm_head = torch.nn.Linear(32, 37, bias=True).double()
    actor = Actor(lm, 2).double().eval()
    assert not actor.plain_head
    check_same(actor, *random_samples(), one_row)


def test_rows_are_as_long_as_the_longest_sequence():
    """Several rows: each at most the longest sequence long (the padded layout's width), filled
    longest first, so there are fewer rows than sequences and every real token appears once."""
    prompts = [[5] * 3, [6] * 2, [7] * 4, [8] * 2, [9] * 1]
    responses = [[4] * 9, [4] * 2, [4] * 1, [4] * 3, [4] * 2]  # lengths 12, 4, 5, 5, 3
    b = make_packed_batch(prompts, responses, "cpu", 0, one_row=False)
    assert b["input_ids"].shape == (3, 12)  # [12], [5, 5], [4, 3] (+ a tail of 5 padding)
    assert int((b["input_ids"] != 0).sum()) == 29
    flat = b["input_ids"].flatten()
    for i, (pr, rs) in enumerate(zip(prompts, responses)):
        at = b["prompt_index"][i][: len(pr)]
        assert flat[at].tolist() == pr
        assert flat[b["response_index"][i][: len(rs)] + 1].tolist() == rs  # the next position holds the token
    one = make_packed_batch(prompts, responses, "cpu", 0, one_row=True)
    assert one["input_ids"].shape == (1, 29)


def test_restarting_positions_matter():
    """The check above can fail: a packed row without restarting position ids (one long sequence
    across the samples) changes every log-prob after the first sample."""
    actor = Actor(tiny("qwen2"), 2).double().eval()
    prompts, responses = random_samples()
    batch = make_packed_batch(prompts, responses, "cpu")
    batch["position_ids"] = torch.arange(batch["input_ids"].shape[1])[None]
    lp = actor(batch)[0]
    assert not torch.allclose(lp, actor(make_batch(prompts, responses, 0, "cpu"))[0])


def test_packing_setting_resolves_per_model():
    qwen = tiny("qwen2")
    on, one_row, msg = use_packing("auto", qwen)
    assert on and not one_row and "block-diagonal" in msg  # sdpa: rows of the longest sequence
    assert use_packing("true", qwen)[0]
    assert use_packing("false", qwen) == (False, False, "packing: off (data.packing=false)")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20))
    assert "gpt2" in packing_blocker(gpt2)
    on, _, msg = use_packing("auto", gpt2)
    assert not on and "gpt2" in msg
    with pytest.raises(ConfigError, match="data.packing=true: model_type 'gpt2'"):
        use_packing("true", gpt2)
    windowed = tiny("mistral", sliding_window=4)
    assert packing_blocker(windowed) == "sliding-window attention"


def use_packing(setting: str, lm):
    """The Layout's decision (layout/resolve.py `packing`) for a loaded model, as a worker makes it."""
    return layout.packing(setting, lm.config, lm.config._attn_implementation)


def packing_blocker(lm):
    return layout.packing_blocker(lm.config)
