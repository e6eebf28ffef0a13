"""model.fused_lm_head: the fused path (linear_token_logprob from the hidden states) gives the
unfused path's log-probs, entropies and gradients; `auto` keeps the embedded default unfused on
CPU; heads with transformed logits fall back (auto) or are refused (true); one trainer run with
the fused head keeps the step-0 importance weight at exactly 1."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import Gemma2Config, Gemma2ForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tests.helpers.train import read_metrics
from reasonrl_fast.models.tiny import char_tokenizer, tiny_model
from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast.layout import FUSED_CPU_MIN_ELEMENTS, fused_head, tokens_per_forward
from reasonrl_fast.models.lm_head import check_model, head_blocker, meta_model
from reasonrl_fast.trainer.policy import Actor, make_batch

CPU = torch.device("cpu")


def use_fused(setting: str, lm, device: torch.device, tokens: int):
    """The Layout's decision (layout/resolve.py `fused_head`) for a built model, as a worker makes it."""
    return fused_head(setting, head_blocker(lm), device.type, tokens, lm.get_output_embeddings().weight.shape[0])


def _qwen(tied: bool, vocab: int = 61) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    lm = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # logits of a few units, so the softmax is far from uniform
        lm.lm_head.weight.normal_(0, 0.5)
    return lm


def _batch(vocab: int):
    g = torch.Generator().manual_seed(1)
    ids = lambda n: torch.randint(1, vocab, (n,), generator=g).tolist()  # noqa: E731
    return make_batch([ids(3), ids(5), ids(1)], [ids(6), ids(2), ids(4)], 0, "cpu")


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_fused_matches_unfused_values_and_gradients(tied, dtype, tol):
    lm = _qwen(tied).to(dtype)
    if tied:
        assert lm.lm_head.weight is lm.model.embed_tokens.weight
    plain, fused = Actor(lm, fused=False), Actor(copy.deepcopy(lm), fused=True)
    batch = _batch(61)
    mask = batch["response_mask"].to(dtype)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=dtype)[:, None]
    outs = []
    for actor in (plain, fused):
        lp, ent, _ = actor(batch, temperature=0.7, entropy=True)
        # A loss that reaches every position through both outputs, weighted unevenly.
        ((lp * adv * mask).sum() + 0.3 * (ent * mask).sum()).backward()
        outs.append((lp, ent, {n: p.grad for n, p in actor.named_parameters()}))
    (lp0, ent0, g0), (lp1, ent1, g1) = outs
    assert lp0.dtype == lp1.dtype and (mask > 0).any()
    torch.testing.assert_close(lp1, lp0, rtol=tol, atol=tol)
    torch.testing.assert_close(ent1, ent0, rtol=tol, atol=tol)
    assert g0.keys() == g1.keys()
    for name in g0:
        assert g0[name] is not None and g1[name] is not None, name
        torch.testing.assert_close(g1[name], g0[name], rtol=tol, atol=tol, msg=name)
    head = "lm.model.embed_tokens.weight" if tied else "lm.lm_head.weight"
    assert g1[head].abs().sum() > 0


def test_auto_keeps_the_embedded_default_unfused_on_cpu():
    cfg = load_config(None, [])
    assert cfg.model.fused_lm_head == "auto"
    tok = char_tokenizer()
    lm = tiny_model(cfg.model, len(tok), tok)
    world = cfg.trainer.nnodes * cfg.trainer.workers_per_node
    tokens = tokens_per_forward(cfg, world)
    assert tokens == 8 * cfg.rollout.n * cfg.rollout.max_new_tokens  # 8 prompts per worker
    fused, msg = use_fused("auto", lm, CPU, tokens)
    assert not fused and "auto" in msg
    # The same model fuses on a GPU, and on CPU once tokens x vocabulary reach the threshold.
    assert use_fused("auto", lm, torch.device("cuda"), tokens)[0]
    big = -(-FUSED_CPU_MIN_ELEMENTS // len(tok))
    assert use_fused("auto", lm, CPU, big)[0] and not use_fused("auto", lm, CPU, big - 1)[0]
    assert use_fused("true", lm, CPU, 1)[0] and not use_fused("false", lm, CPU, 10**9)[0]


def _gemma2():
    torch.manual_seed(0)
    cfg = Gemma2Config(vocab_size=53, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                       final_logit_softcapping=2.0)
    return Gemma2ForCausalLM(cfg)


def test_soft_capped_head_falls_back_with_the_models_own_logits():
    lm = _gemma2()
    fused, msg = use_fused("auto", lm, torch.device("cuda"), 10**6)
    assert not fused and "final_logit_softcapping=2.0" in msg
    with pytest.raises(ConfigError, match=r"model.fused_lm_head=true.*final_logit_softcapping"):
        use_fused("true", lm, CPU, 1)
    with pytest.raises(ConfigError, match="final_logit_softcapping"):
        check_model("true", lm.config)  # the driver's check, before any worker starts
    check_model("auto", lm.config)  # auto and false fall back on the workers: nothing to refuse here
    check_model("false", lm.config)
    # The driver's meta-device model shows the blocker the worker's rule falls back on; a plain head none.
    assert "final_logit_softcapping" in head_blocker(meta_model(lm.config))
    assert head_blocker(meta_model(_qwen(False).config)) is None
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        Actor(lm, fused=True)
    # The fallback's log-probs are the model's own: soft-capped logits / temperature.
    batch = _batch(53)
    lp, ent, _ = Actor(lm)(batch, temperature=0.5, entropy=True)
    full = lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
              position_ids=batch["position_ids"]).logits.double()
    p = batch["prompt_len"]
    logp = torch.log_softmax(full[:, p - 1:-1] / 0.5, -1)
    tgt = batch["targets"]
    want = logp.gather(-1, tgt.clamp(min=0)[..., None])[..., 0] * (tgt != -100)
    want_ent = -(logp.exp() * logp).sum(-1) * (tgt != -100)
    torch.testing.assert_close(lp.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), want_ent, rtol=1e-5, atol=1e-5)
    # Soft-capping bounds |logit| by 2: a plain head would have given other values.
    plain = torch.log_softmax(lm.lm_head(lm.model(input_ids=batch["input_ids"]).last_hidden_state)
                              [:, p - 1:-1].double() / 0.5, -1)
    assert (plain - logp).abs().max() > 1e-2


class _ScaledHead(nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.weight = linear.weight

    def forward(self, h):
        return 2 * h @ self.weight.T


@pytest.mark.parametrize("change,expect", [
    (lambda lm: setattr(lm.config, "logit_scale", 0.0625), "logit_scale=0.0625"),
    (lambda lm: setattr(lm.config, "logits_scaling", 8.0), "logits_scaling=8.0"),
    (lambda lm: setattr(lm, "lm_head", nn.Linear(32, 61, bias=True)), "bias"),
    (lambda lm: setattr(lm, "lm_head", _ScaledHead(lm.lm_head)),
     "_ScaledHead, not a plain nn.Linear"),
])
def test_heads_that_are_not_plain_linear_are_named(change, expect):
    lm = _qwen(False)
    assert head_blocker(lm) is None
    change(lm)
    assert expect in head_blocker(lm)
    with pytest.raises(ConfigError, match="model.fused_lm_head=true"):
        use_fused("true", lm, CPU, 1)
    # A scale of exactly 1 changes nothing and does not block.
    if expect.startswith("logit"):
        setattr(lm.config, expect.split("=")[0], 1.0)
        assert head_blocker(lm) is None


@pytest.mark.parametrize("value,want", [("auto", "auto"), ("true", "true"), ("True", "true"),
                                        ("false", "false"), ("FALSE", "false")])
def test_config_accepts_auto_and_booleans(value, want):
    assert load_config(None, [f"model.fused_lm_head={value}"]).model.fused_lm_head == want


@pytest.mark.parametrize("value", ["maybe", "1", "fused"])
def test_config_rejects_other_values_naming_the_key(value):
    with pytest.raises(ConfigError, match="model.fused_lm_head"):
        load_config(None, [f"model.fused_lm_head={value}"])


def test_yaml_booleans(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model:\n  fused_lm_head: yes\n")  # YAML 1.1's boolean: read as written, and refused
    with pytest.raises(ConfigError, match=r"model.fused_lm_head='yes': must be auto, true or false"):
        load_config(str(f))
    f.write_text("model:\n  fused_lm_head: true\n")
    assert load_config(str(f)).model.fused_lm_head == "true"
    f.write_text("model:\n  fused_lm_head: false\n")
    assert load_config(str(f)).model.fused_lm_head == "false"


def test_trainer_run_with_the_fused_head(train, tmp_path):
    """FlowRL (reference pass), two mini-batches (old-log-prob pass) and lr 0: the policy never
    moves, so every importance weight exp(sum(lp - old)) is 1 exactly when the old, reference and
    update passes compute log-probs the same way."""
    out = tmp_path / "run"
    p = train(["model.fused_lm_head=true", "optim.mini_batch_prompts=2", "optim.lr=0",
               "trainer.steps=1", f"trainer.output_dir={out}"], tmp_path)
    assert "fused LM head on (model.fused_lm_head=true)" in p.stdout + p.stderr
    rows = [r for r in read_metrics(out) if "tb/is_weight_mean" in r]
    assert rows, read_metrics(out)
    assert rows[0]["tb/is_weight_mean"] == pytest.approx(1.0, abs=1e-6)
    assert rows[0]["tb/delta_abs_mean"] == rows[0]["tb/delta_abs_mean"]  # finite, not NaN


def test_the_setting_does_not_change_the_warm_start_cache():
    from reasonrl_fast.trainer.sft import sft_cache_path

    base = sft_cache_path(load_config(None, []))
    assert sft_cache_path(load_config(None, ["model.fused_lm_head=true"])) == base
    assert sft_cache_path(load_config(None, ["model.hidden_size=64"])) != base
