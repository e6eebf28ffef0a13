"""rollout/lean.py: the lean decoder against the model's own forward, for each supported
architecture (Llama, Qwen2 with q/k/v biases, Qwen3 with q/k norms, Mistral), with left padding:
logits at every step in float64, greedy tokens, the sampling distribution, bf16 error against
the model's bf16 error, weight refresh through the fused tensors, and the fallback for other
models (a few seconds)."""

import numpy as np
import pytest
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from reasonrl_fast.rollout.hf import HFEngine
from reasonrl_fast.rollout.sampling import _keep_top_p, hf_stepper, sample
from reasonrl_fast.rollout.lean import LeanDecoder, unsupported

V, PAD, EOS = 29, 0, 2
SIZES = dict(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=6,
             num_key_value_heads=2, max_position_embeddings=64, pad_token_id=PAD, eos_token_id=EOS)
ARCHS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SIZES, attention_bias=True, mlp_bias=True)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SIZES, tie_word_embeddings=True)),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SIZES, head_dim=16)),  # head_dim != hidden / heads
    "mistral": lambda: MistralForCausalLM(MistralConfig(**SIZES, sliding_window=None)),
}


def _model(arch: str, seed: int = 0, dtype=torch.float64):
    torch.manual_seed(seed)
    model = ARCHS[arch]().to(dtype).eval()
    with torch.no_grad():  # norms away from 1 and biases away from 0, so that a missed one shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def _batch(n: int = 7):
    rng = np.random.default_rng(torch.initial_seed() % 2**32)
    prompts = [torch.randint(3, V, (int(rng.integers(1, 9)),)).tolist() for _ in range(n)]
    width = max(map(len, prompts))
    ids = torch.full((n, width), PAD)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], attn[i, width - len(p):] = torch.tensor(p), 1
    return ids, attn


def _logits(step, tokens: torch.Tensor) -> torch.Tensor:
    """The logits a stepper gives after the prompt and after each of `tokens` [B, T]."""
    out = [step(None)]
    for t in range(tokens.shape[1] - 1):
        out.append(step(tokens[:, t]))
    return torch.stack(out, 1)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_logits_equal_the_models_forward_at_every_step(arch):
    model = _model(arch)
    ids, attn = _batch()
    with torch.no_grad():
        ref_model = _model(arch)  # an unfused copy: fusing must not change the model's own forward
        lean = LeanDecoder(model)
        tokens = torch.randint(3, V, (ids.shape[0], 10))
        ref = _logits(hf_stepper(ref_model, ids, attn), tokens)
        ours = _logits(lean.stepper(ids, attn, 10), tokens)
        fused_forward = _logits(hf_stepper(model, ids, attn), tokens)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fused_forward, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_tokens_equal_the_models(arch):
    model = _model(arch, seed=1)
    ids, attn = _batch(9)
    ref = sample(model, ids, attn, 0.0, 1.0, 12, eos_id=-1, pad_id=PAD)[0]
    ours = sample(model, ids, attn, 0.0, 1.0, 12, eos_id=-1, pad_id=PAD, lean=LeanDecoder(model))[0]
    assert ours.shape == (9, 12) and torch.equal(ours, ref)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (1.3, 0.8)])
def test_first_token_follows_the_distribution(temperature, top_p):
    model = _model("qwen2", seed=2)
    lean = LeanDecoder(model)
    ids = torch.tensor([[5, 9, 11]] * 20_000)
    toks = sample(model, ids, torch.ones_like(ids), temperature, top_p, 1, eos_id=EOS, pad_id=PAD, lean=lean,
                  seeds=torch.arange(len(ids)))[0][:, 0]
    with torch.no_grad():
        logits = model(input_ids=ids[:1]).logits[0, -1] / temperature
    p = _keep_top_p(logits[None], top_p)[0].softmax(-1)
    freq = torch.bincount(toks, minlength=V).double() / len(toks)
    sigma = (p * (1 - p) / len(toks)).sqrt()
    assert torch.all((freq - p).abs() <= 5 * sigma + 1e-12), (freq, p)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_bf16_error_at_most_twice_the_models(arch):
    ids, attn = _batch(16)
    tokens = torch.randint(3, V, (16, 8))
    with torch.no_grad():
        exact = _logits(hf_stepper(_model(arch), ids, attn), tokens)
        model_bf16 = _model(arch, dtype=torch.bfloat16)
        theirs = _logits(hf_stepper(model_bf16, ids, attn), tokens).double()
        ours = _logits(LeanDecoder(_model(arch, dtype=torch.bfloat16)).stepper(ids, attn, 8), tokens).double()
    err_theirs, err_ours = (theirs - exact).abs().max(), (ours - exact).abs().max()
    assert err_ours <= 2 * err_theirs, (err_ours, err_theirs)


def test_weight_refresh_reaches_the_fused_projections():
    engine = HFEngine(_model("qwen2", seed=3), PAD, EOS, torch.device("cpu"))
    assert engine.lean is not None
    new = _model("qwen2", seed=4)
    engine.load_weights(new.named_parameters())
    ids, attn = _batch(5)
    ref = sample(new, ids, attn, 0.0, 1.0, 8, eos_id=-1, pad_id=PAD)[0]
    assert torch.equal(sample(engine.model, ids, attn, 0.0, 1.0, 8, eos_id=-1, pad_id=PAD, lean=engine.lean)[0], ref)


def test_engines_choose_and_reproduce():
    lean_engine = HFEngine(_model("qwen2", seed=5), PAD, EOS, torch.device("cpu"))
    model_engine = HFEngine(_model("qwen2", seed=5), PAD, EOS, torch.device("cpu"), decoder="model")
    assert lean_engine.lean is not None and model_engine.lean is None
    for temperature in (0.0, 1.0):  # greedy, and sampled with the same seeds
        args = ([[7, 3], [4, 8, 8]], 4, temperature, 1.0, 12, list(range(8)))
        a, b = lean_engine.generate(*args), model_engine.generate(*args)
        assert a.tokens == b.tokens
        torch.testing.assert_close(torch.tensor(sum(a.logprobs, [])), torch.tensor(sum(b.logprobs, [])))
    with pytest.raises(ValueError, match="decoder='fast'"):
        HFEngine(_model("qwen2"), PAD, EOS, torch.device("cpu"), decoder="fast")


def test_other_models_fall_back_to_their_forward():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=1, n_head=2, n_positions=32)).eval()
    assert "model_type 'gpt2'" in unsupported(gpt2)
    assert HFEngine(gpt2, PAD, EOS, torch.device("cpu")).lean is None
    windowed = Qwen2ForCausalLM(Qwen2Config(**SIZES, use_sliding_window=True, sliding_window=8, max_window_layers=0))
    assert unsupported(windowed) == "sliding-window attention"
    with pytest.raises(ValueError, match="lean decoder: sliding-window attention"):
        LeanDecoder(windowed)


def test_more_steps_than_planned_is_an_error():
    lean = LeanDecoder(_model("llama"))
    ids, attn = _batch(2)
    step = lean.stepper(ids, attn, 1)
    step(None)
    step(torch.tensor([3, 4]))
    with pytest.raises(RuntimeError, match="max_new_tokens=1"):
        step(torch.tensor([3, 4]))
