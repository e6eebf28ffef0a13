"""rollout/engines.py `sample`: the HF rollout's own sampling loop over a Hugging Face causal LM
and its KV cache, against `generate` (greedy, token for token, with left padding), against the
exact next-token distribution (temperature, top-p), and its handling of EOS (a few seconds)."""

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from reasonrl_fast.rollout.engines import HFRollout, _keep_top_p, sample

V, PAD, EOS = 29, 0, 2


def _model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, pad_token_id=PAD, eos_token_id=EOS)
    return Qwen2ForCausalLM(cfg).double().eval()  # float64: no near-ties between the two paths


def _left_pad(prompts):
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], attn[i, width - len(p):] = torch.tensor(p), 1
    return ids, attn


def _prompts(rng, n):
    return [torch.randint(3, V, (int(rng.integers(1, 9)),)).tolist() for _ in range(n)]


def test_greedy_equals_generate_with_left_padding():
    import numpy as np

    model = _model()
    ids, attn = _left_pad(_prompts(np.random.default_rng(torch.initial_seed() % 2**32), 7))
    ours = sample(model, ids, attn, 0.0, 1.0, 12, eos_id=-1, pad_id=PAD)  # no EOS: all 12 tokens
    ref = model.generate(input_ids=ids, attention_mask=attn, do_sample=False, max_new_tokens=12, min_new_tokens=12,
                         pad_token_id=PAD, eos_token_id=None)[:, ids.shape[1]:]
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_first_token_follows_the_distribution(temperature, top_p):
    model = _model(1)
    ids, attn = _left_pad([[5, 9, 11]] * 20_000)
    toks = sample(model, ids, attn, temperature, top_p, 1, eos_id=EOS, pad_id=PAD)[:, 0]
    logits = model(input_ids=ids[:1]).logits[0, -1] / temperature
    p = _keep_top_p(logits[None], top_p)[0].softmax(-1) if top_p < 1 else logits.softmax(-1)
    freq = torch.bincount(toks, minlength=V).double() / len(toks)
    sigma = (p * (1 - p) / len(toks)).sqrt()
    assert torch.all((freq - p).abs() <= 5 * sigma + 1e-12), (freq, p)  # 5 sigma per token
    if top_p < 1:
        assert torch.all(freq[p == 0] == 0)  # nothing outside the nucleus


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)]])
    assert torch.isinf(_keep_top_p(logits, 0.8)).tolist() == [[False, False, True, True]]   # 0.5 + 0.3 reaches 0.8
    assert torch.isinf(_keep_top_p(logits, 0.81)).tolist() == [[False, False, False, True]]
    assert torch.isinf(_keep_top_p(logits, 1e-9)).tolist() == [[False, True, True, True]]   # the top token stays


class _Scripted(torch.nn.Module):
    """A stand-in causal LM whose row r emits EOS at its step `ends[r]` (never when None) and
    token 5 otherwise; counts its forward calls."""

    def __init__(self, ends):
        super().__init__()
        self.ends, self.calls = ends, 0
        self.config = Qwen2Config(vocab_size=V)

    def forward(self, input_ids, attention_mask, position_ids, past_key_values, use_cache, logits_to_keep=0):
        # (an older transformers' argument name: sample must pass the cache by either)
        step = self.calls
        self.calls += 1
        logits = torch.full((input_ids.shape[0], input_ids.shape[1], V), -1e4)  # exp underflows to 0
        logits[..., 5] = 0.0
        for r, end in enumerate(self.ends):
            if end == step:
                logits[r, :, EOS] = 1e4
        return type("Out", (), {"logits": logits})()


def test_rows_end_at_eos_then_pad():
    model = _Scripted([0, 2, None])
    ids, attn = _left_pad([[7, 3], [4], [9, 9, 9]])
    out = sample(model, ids, attn, 0.0, 1.0, 6, eos_id=EOS, pad_id=PAD)
    assert out.tolist() == [[EOS, PAD, PAD, PAD, PAD, PAD], [5, 5, EOS, PAD, PAD, PAD], [5] * 6]
    assert model.calls == 6  # the prefill and 5 decoding steps: the 6th token needs no forward


def test_stops_once_every_row_has_ended():
    model = _Scripted([1, 0, 1])
    ids, attn = _left_pad([[7], [4], [9]])
    out = sample(model, ids, attn, 1.0, 1.0, 50, eos_id=EOS, pad_id=PAD)
    assert out.tolist() == [[5, EOS], [EOS, PAD], [5, EOS]] and model.calls == 2


def test_engine_cuts_after_eos_and_is_reproducible():
    engine = HFRollout(_model(2), PAD, EOS, torch.device("cpu"))
    res = engine.generate([[7, 3], [4]], 3, 1.0, 1.0, 20, seed=3)
    assert len(res) == 6 and all(len(r) <= 20 and (EOS not in r or r.index(EOS) == len(r) - 1) for r in res)
    assert res == engine.generate([[7, 3], [4]], 3, 1.0, 1.0, 20, seed=3)
