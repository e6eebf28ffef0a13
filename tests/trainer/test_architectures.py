"""Causal LMs of other layouts than Llama's: the trainer reaches the decoder and the output layer
through transformers' API (`get_decoder()`, `base_model_prefix`, `get_output_embeddings()`), so
its log-probs from the decoder's hidden states (fused head or not) are the model's own for a
Qwen2, a Llama and a GPT-2 (decoder `transformer`, blocks `transformer.h`, tied head); FSDP2
finds each model's blocks; a model whose decoder cannot be found is refused in one line; and a
GPT-2 directory trains a step through the real trainer."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from reasonrl_fast.errors import ConfigError
from reasonrl_fast.models.lm_head import check_trainable, decoder_of, head_of
from reasonrl_fast.models.loading import decoder_layers
from reasonrl_fast.trainer.policy import Actor, make_batch
from tests.helpers.train import read_metrics
from tests.helpers.model_dirs import model_dir, tiny_lm

ARCHS = ["qwen2", "llama", "gpt2"]


def _batch(vocab: int):
    g = torch.Generator().manual_seed(3)
    ids = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    return make_batch([ids(4), ids(7), ids(2)], [ids(5), ids(1), ids(6)], 0, "cpu")


def _own_logprobs(lm, batch, temperature):
    """Log-probs and entropies of the response tokens from the causal LM's own forward."""
    logits = lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"]).logits
    p, tgt = batch["prompt_len"], batch["targets"]
    logp = torch.log_softmax(logits[:, p - 1:-1].double() / temperature, -1)
    keep = tgt != -100
    lp = logp.gather(-1, tgt.clamp(min=0)[..., None])[..., 0] * keep
    return lp, -(logp.exp() * logp).sum(-1) * keep


@pytest.mark.parametrize("arch", ARCHS)
def test_the_decoder_path_gives_the_models_own_logprobs(arch):
    lm = tiny_lm(arch).double().eval()
    with torch.no_grad():  # logits far from uniform, so a wrong hidden state shows
        head_of(lm).weight.normal_(0, 0.5)
    batch = _batch(lm.config.vocab_size)
    want_lp, want_ent = _own_logprobs(lm, batch, 0.7)
    for fused in (False, True):
        actor = Actor(copy.deepcopy(lm), zhead_layers=1, fused=fused).double()
        assert actor.plain_head  # the hidden-state path, not the model's forward
        lp, ent, z = actor(batch, temperature=0.7, entropy=True, log_z=True)
        torch.testing.assert_close(lp.double(), want_lp, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(ent.double(), want_ent, rtol=1e-10, atol=1e-10)
        assert z.shape == (3,) and torch.isfinite(z).all()
        # the parameter names stay the model's own (checkpoints, weight sync): no second copy
        names = [n for n, _ in actor.named_parameters()]
        assert len(names) == len(set(names)) and all(n.startswith(("lm.", "proj_z.")) for n in names)
        assert len(actor.state_dict()) == len(lm.state_dict()) + len(actor.proj_z.state_dict())


def test_decoder_head_and_blocks_are_found_through_the_hf_api():
    gpt2, qwen = tiny_lm("gpt2"), tiny_lm("qwen2")
    assert decoder_of(gpt2) is gpt2.transformer and head_of(gpt2) is gpt2.lm_head
    assert decoder_of(qwen) is qwen.model and head_of(qwen) is qwen.lm_head
    # FSDP2's per-layer units: each model's own blocks, not the root alone
    assert decoder_layers(gpt2) == list(gpt2.transformer.h)
    assert decoder_layers(qwen) == list(qwen.model.layers)


class _Opaque(nn.Module):
    """A causal LM with an output layer but no decoder that transformers' API names."""

    def __init__(self, head: bool = True):
        super().__init__()
        self.blocks = nn.Linear(8, 8)
        self.out = nn.Linear(8, 11, bias=False) if head else None

    def get_output_embeddings(self):
        return self.out


def test_a_model_the_trainer_cannot_read_is_refused_in_one_line():
    for lm, lacks in ((_Opaque(), "exposes no decoder"), (_Opaque(head=False), "has no output layer")):
        with pytest.raises(ConfigError) as e:
            check_trainable(lm)
        line = str(e.value)
        assert "\n" not in line and "_Opaque" in line and lacks in line, line
        with pytest.raises(ConfigError, match=lacks):
            Actor(lm)


def test_a_gpt2_directory_trains_a_step(train, tmp_path):
    """Through the real trainer: rollout, the update on two FSDP2 ranks sharded per GPT-2 block,
    FlowRL's Z-head and reference model, the weight sync."""
    path = model_dir(tmp_path / "gpt2")
    out = tmp_path / "run"
    p = train([f"model.path={path}", "trainer.steps=1", "trainer.val_every=0", "trainer.sharding=fsdp",
               f"trainer.output_dir={out}"], tmp_path)
    assert "data parallel: fsdp" in p.stdout and "packing: off (model_type 'gpt2'" in p.stdout
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1] and rows[0]["train/grad_norm"] > 0


def test_preflight_reads_a_gpt2_directory_and_refuses_what_its_workers_would(tmp_path):
    """A GPT-2's config (MLP width n_inner, None for 4 x n_embd) passes the shape check; packing
    forced on it and a directory without weights are refused before Ray, in one line each."""
    from reasonrl_fast.config import load_config
    from reasonrl_fast.models.loading import ModelPathError
    from reasonrl_fast.preflight import preflight

    def cfg(path, *extra):
        return load_config(None, [f"model.path={path}", f"trainer.output_dir={tmp_path / 'run'}", *extra])

    gpt2 = model_dir(tmp_path / "gpt2")
    assert preflight(cfg(gpt2)).model_type == "gpt2"
    with pytest.raises(ConfigError, match=r"^data\.packing=true: model_type 'gpt2' is not one of .*data\.packing=auto"):
        preflight(cfg(gpt2, "data.packing=true"))
    bare = model_dir(tmp_path / "bare", "qwen2", weights=False)
    with pytest.raises(ModelPathError, match=r"^model\.path=.*bare'?: the directory has no weights \(none of model"):
        preflight(cfg(bare))
