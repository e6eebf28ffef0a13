"""rollout/sampling.py `sample`: the HF rollout's own sampling loop over a Hugging Face causal LM and
its KV cache, against `generate` (greedy, token for token, with left padding), against the exact
next-token distribution (temperature, top-p), its handling of EOS, its per-row seeds and the
log-probs it reports (a few seconds)."""

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from reasonrl_fast.rollout import sample_seed, sample_seeds
from reasonrl_fast.rollout.hf import HFEngine
from reasonrl_fast.rollout.sampling import _keep_top_p, gumbel_noise, sample

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
    ours = sample(model, ids, attn, 0.0, 1.0, 12, eos_id=-1, pad_id=PAD)[0]  # no EOS: all 12 tokens
    ref = model.generate(input_ids=ids, attention_mask=attn, do_sample=False, max_new_tokens=12, min_new_tokens=12,
                         pad_token_id=PAD, eos_token_id=None)[:, ids.shape[1]:]
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_first_token_follows_the_distribution(temperature, top_p):
    model = _model(1)
    ids, attn = _left_pad([[5, 9, 11]] * 20_000)
    toks = sample(model, ids, attn, temperature, top_p, 1, eos_id=EOS, pad_id=PAD, seeds=torch.arange(len(ids)))[0][:, 0]
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


def _top_p_by_sorting(logits, top_p):
    """The nucleus by sorting values and indices: the set of the smallest mass reaching top_p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    drop = probs.cumsum(-1) - probs >= top_p
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def _distinct_logits(shape, dtype):
    """Random logits with no two alike in a row (ties are the one place the two rules differ): a
    random permutation of 0..V-1 per row, centred and scaled by a power of two (exact in float32)
    to about +-4."""
    v = shape[-1]
    perm = torch.rand(shape).argsort(-1).to(torch.float64) - v // 2
    return (perm * 2.0 ** -max(0, v.bit_length() - 3)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 151_937), (2, 3, 50)])
def test_top_p_equals_the_nucleus_by_sorting_and_keeps_ties_with_the_last_token(shape, dtype):
    # (a top_p within float32's rounding of 1 is left out: there the running mass moves by less than
    # its spacing, and where it first reaches top_p depends on the order of the additions)
    for top_p in (1e-6, 0.3, 0.7, 0.95):
        logits = _distinct_logits(shape, dtype)
        assert torch.equal(_keep_top_p(logits, top_p), _top_p_by_sorting(logits, top_p)), top_p
    # ties: both tokens of the boundary's value stay (sorting keeps one of them, whichever it orders first)
    tied = torch.tensor([[math.log(0.4), math.log(0.2), math.log(0.2), math.log(0.2)]], dtype=dtype)
    assert torch.isinf(_keep_top_p(tied, 0.5)).tolist() == [[False, False, False, False]]
    assert torch.isinf(_keep_top_p(tied, 0.3)).tolist() == [[False, True, True, True]]
    masked = torch.tensor([[0.0, float("-inf"), 1.0, float("-inf")]], dtype=dtype)  # tokens already masked
    assert torch.isinf(_keep_top_p(masked, 0.99)).tolist() == [[False, True, False, True]]


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
    out = sample(model, ids, attn, 0.0, 1.0, 6, eos_id=EOS, pad_id=PAD)[0]
    assert out.tolist() == [[EOS, PAD, PAD, PAD, PAD, PAD], [5, 5, EOS, PAD, PAD, PAD], [5] * 6]
    assert model.calls == 6  # the prefill and 5 decoding steps: the 6th token needs no forward


def test_stops_once_every_row_has_ended():
    model = _Scripted([1, 0, 1])
    ids, attn = _left_pad([[7], [4], [9]])
    out = sample(model, ids, attn, 1.0, 1.0, 50, eos_id=EOS, pad_id=PAD)[0]
    assert out.tolist() == [[5, EOS], [EOS, PAD], [5, EOS]] and model.calls == 2


def test_engine_cuts_after_eos_and_is_reproducible():
    engine = HFEngine(_model(2), PAD, EOS, torch.device("cpu"))
    res = engine.generate([[7, 3], [4]], 3, 1.0, 1.0, 20, seeds=list(range(6)))
    assert len(res.tokens) == 6 and all(len(r) <= 20 and (EOS not in r or r.index(EOS) == len(r) - 1) for r in res.tokens)
    assert [len(x) for x in res.logprobs] == [len(r) for r in res.tokens]
    again = engine.generate([[7, 3], [4]], 3, 1.0, 1.0, 20, seeds=list(range(6)))
    assert again.tokens == res.tokens and again.logprobs == res.logprobs
    with pytest.raises(ValueError, match="5 seeds for 6 samples"):
        engine.generate([[7, 3], [4]], 3, 1.0, 1.0, 20, seeds=list(range(5)))


def test_engine_samples_in_the_dtype_it_is_given_and_the_sync_casts_into_it():
    """The trainer hands the sampler its compute dtype (bf16 over fp32 masters under FSDP2)."""
    lm = _model(2).float()
    engine = HFEngine(lm, PAD, EOS, torch.device("cpu"), dtype=torch.bfloat16)
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in lm.parameters()} == {torch.float32}  # the trained model is untouched
    res = engine.generate([[7, 3]], 2, 1.0, 1.0, 8, seeds=[0, 1])
    assert len(res.tokens) == 2 and all(torch.isfinite(torch.tensor(x)).all() for x in res.logprobs)
    full = {n: p.detach() * 0 + 0.5 for n, p in lm.named_parameters()}  # fp32 tensors, as the sync sends
    engine.load_weights(full.items())
    assert all(p.dtype == torch.bfloat16 and bool((p == 0.5).all()) for p in engine.model.parameters())


def test_a_rows_sample_depends_on_its_seed_only():
    """The same seed gives the same response alone, in a batch of others, at another place in
    the batch, and beside prompts of other lengths (other padding); other seeds give others."""
    engine = HFEngine(_model(3), PAD, EOS, torch.device("cpu"))
    seeds = sample_seeds(11, 4, 0, 6)
    together = engine.generate([[7, 3], [4], [9, 9, 9, 9, 9]], 2, 1.0, 0.9, 16, seeds).tokens
    alone = [engine.generate([p], 1, 1.0, 0.9, 16, [s]).tokens[0]
             for p, s in zip([[7, 3], [7, 3], [4], [4], [9, 9, 9, 9, 9], [9, 9, 9, 9, 9]], seeds)]
    assert together == alone
    reversed_ = engine.generate([[9, 9, 9, 9, 9], [4], [7, 3]], 2, 1.0, 0.9, 16, seeds[4:] + seeds[2:4] + seeds[:2]).tokens
    assert reversed_[4:] + reversed_[2:4] + reversed_[:2] == together
    other = engine.generate([[7, 3], [4], [9, 9, 9, 9, 9]], 2, 1.0, 0.9, 16, sample_seeds(12, 4, 0, 6)).tokens
    assert other != together


def test_reported_logprobs_are_the_models_under_the_sampling_distribution():
    """The sampler's log-prob of each token equals log_softmax(logits / T) of a fresh forward over
    prompt + response (float64), with top-p renormalised over the nucleus."""
    model = _model(4)
    engine = HFEngine(model, PAD, EOS, torch.device("cpu"), decoder="model")
    prompts = [[7, 3], [4, 5, 6]]
    for temperature, top_p in [(1.0, 1.0), (0.7, 1.0), (1.2, 0.85)]:
        res = engine.generate(prompts, 3, temperature, top_p, 10, sample_seeds(0, 1, 0, 6))
        for i, (toks, lps) in enumerate(zip(res.tokens, res.logprobs)):
            p = prompts[i // 3]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([p + toks])).logits[0, len(p) - 1:-1] / temperature
            if top_p < 1:
                logits = _keep_top_p(logits, top_p)
            want = logits.log_softmax(-1).gather(-1, torch.tensor(toks)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(lps, dtype=torch.float64), want, rtol=0, atol=1e-5)


def test_gumbel_noise_is_a_pure_function_of_seed_position_and_token():
    seeds = torch.tensor([0, 1, 2**62 + 5, sample_seed(3, 4, 5)])
    g = gumbel_noise(seeds, 7, 50)
    assert g.shape == (4, 50) and g.dtype == torch.float64 and torch.isfinite(g).all()
    assert torch.equal(gumbel_noise(seeds[2:3], 7, 50), g[2:3])  # a row alone: the same noise
    assert not torch.equal(gumbel_noise(seeds, 8, 50), g)  # the next position: other noise
    big = gumbel_noise(torch.arange(4000), 0, 50).flatten()  # standard Gumbel: mean 0.5772, var pi^2/6
    assert abs(float(big.mean()) - 0.5772) < 0.01 and abs(float(big.var()) - math.pi**2 / 6) < 0.03


def _splitmix_uniform(seed: int, t: int, vocab: int, token: int) -> float:
    """The noise's uniform draw for one token, in Python integers (SplitMix64: Steele, Lea, Flood
    2014, its increment and finaliser constants)."""
    m = (1 << 64) - 1

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    state = (mix(seed & m) + (t * vocab + token + 1) * 0x9E3779B97F4A7C15) & m
    return ((mix(state) >> 11) + 0.5) / 2.0**53


@pytest.mark.parametrize("vocab", [1, 7, 151_937])
def test_gumbel_noise_is_splitmix64_through_two_logs(vocab):
    """Every row's noise is -log(-log(u)) of its SplitMix64 stream (checked per token in Python
    integers), and bit for bit the out-of-place torch expression of the same formula."""
    from reasonrl_fast.rollout import sampling as s

    seeds = torch.tensor([0, 3, 2**63 - 1, -(2**63), sample_seed(9, 1, 2)])
    g = gumbel_noise(seeds, 5, vocab)
    state = s._mix(seeds)[:, None] + (5 * vocab + torch.arange(1, vocab + 1)) * s._GAMMA
    u = (s._shr(s._mix(state), 11).double() + 0.5) / 2.0**53
    assert torch.equal(g, -torch.log(-torch.log(u)))
    for row, seed in enumerate(seeds.tolist()):
        for token in {0, vocab // 2, vocab - 1}:
            want = -math.log(-math.log(_splitmix_uniform(seed, 5, vocab, token)))
            assert math.isclose(float(g[row, token]), want, rel_tol=1e-14, abs_tol=1e-15), (row, token)


def test_sample_seeds_are_unrelated_and_fit_int64():
    a = sample_seeds(0, 1, 0, 1000)
    assert len(set(a)) == 1000 and all(0 <= s < 2**63 for s in a)
    assert a[5:10] == sample_seeds(0, 1, 5, 5)  # a share's seeds do not depend on where it starts
    assert not set(a) & set(sample_seeds(1, 1, 0, 1000)) and not set(a) & set(sample_seeds(0, 2, 0, 1000))




def test_each_prompt_gets_its_own_length_limit():
    """A limit per prompt (rollout.max_sequence_tokens): each row stops at its own, padded after it
    with log-prob 0, and draws the same tokens as under one limit for all, up to its own."""
    import numpy as np

    model = _model(2)
    prompts = _prompts(np.random.default_rng(torch.initial_seed() % 2**32), 3)
    engine = HFEngine(model, PAD, -1, torch.device("cpu"))  # no EOS: every row runs to its limit
    seeds = sample_seeds(5, 1, 0, 6)
    whole = engine.generate(prompts, 2, 1.0, 1.0, 9, seeds)
    cut = engine.generate(prompts, 2, 1.0, 1.0, [4, 9, 1], seeds)
    assert [len(t) for t in cut.tokens] == [4, 4, 9, 9, 1, 1]
    assert cut.tokens == [t[:len(c)] for t, c in zip(whole.tokens, cut.tokens)]
    torch.testing.assert_close(torch.tensor([lp for row in cut.logprobs for lp in row]),
                               torch.tensor([lp for w, c in zip(whole.logprobs, cut.logprobs) for lp in w[:len(c)]]))
    ids, attn = _left_pad([p for p in prompts for _ in range(2)])
    toks, lps = sample(model, ids, attn, 1.0, 1.0, torch.tensor([4, 4, 9, 9, 1, 1]), eos_id=-1, pad_id=PAD,
                       seeds=torch.tensor(seeds))
    assert toks.shape == (6, 9) and bool((toks[4:, 1:] == PAD).all()) and bool((lps[:2, 4:] == 0).all())
