"""Checks of the vllm rollout engine that run inside the vLLM venv (tests/rollout/test_vllm.py
starts this file there): `python vllm_engine_checks.py WORKDIR`. Each check raises on failure;
the last line printed is "ok" when all passed.

A tiny Qwen2 model (fp32) is built from a config in code and saved; the engine is the project's
VLLMEngine over it on the CPU."""

import math
import os
import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from reasonrl_fast.rollout import sample_seeds
from reasonrl_fast.rollout.vllm import VLLMEngine

V, EOS = 61, 2


def model(seed: int, vocab: int = V, intermediate: int = 128) -> Qwen2ForCausalLM:
    """A random tiny Qwen2 (head size 32: vLLM's CPU attention refuses 16; 4 heads and 2
    key/value heads, which 2 engine ranks split) with a peaked head."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=128, intermediate_size=intermediate, num_hidden_layers=2,
                      num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, eos_token_id=EOS, pad_token_id=0,
                      tie_word_embeddings=False)
    m = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # a peaked distribution, so that EOS and repeats occur
        m.lm_head.weight.mul_(30)
    return m


def teacher_forced(m, prompt, tokens, temperature, top_p=1.0):
    """log-probs of `tokens` after `prompt` under m at `temperature` (top-p renormalised)."""
    with torch.no_grad():
        logits = m(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].double() / temperature
    if top_p < 1:
        from reasonrl_fast.rollout.sampling import _keep_top_p
        logits = _keep_top_p(logits, top_p)
    return logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def stop_strings(engine, prompts, seeds) -> None:
    from reasonrl_fast.rollout.turns import StopStrings

    def letters(ids):
        return "".join(chr(ord("a") + i % 26) for i in ids)

    free = engine.generate(prompts, 4, 1.0, 1.0, 24, seeds)
    # stop strings the samples do write (the peaked model repeats a few tokens): the two longest
    # responses' third token, and another's second and third
    a, b = sorted(range(12), key=lambda i: -len(free.tokens[i]))[:2]
    stops = [letters(free.tokens[a][2:3]), letters(free.tokens[b][1:3])]
    stop = StopStrings(stops, letters, 12, EOS)
    out = engine.generate(prompts, 4, 1.0, 1.0, 24, seeds, stop=stop)
    ended = 0
    for toks, lps, whole, whole_lps, end in zip(out.tokens, out.logprobs, free.tokens, free.logprobs, stop.ends):
        first = next((k for k in range(1, len(whole) + 1) if whole[k - 1] != EOS
                      and any(letters(whole[:k]).endswith(s) for s in stops)), None)
        if first is None:
            assert end is None and toks == whole, (toks, whole)
        else:
            assert end == first and toks == whole[:first] and lps == whole_lps[:first], (toks, whole, end)
            ended += 1
    assert ended >= 2, f"too few requests met a stop string: {ended}"


def partial_rollouts(engine, first, second, prompts, k: int = 4) -> None:
    """A rollout worker's two threads as Ray runs them in split placement: a load published while
    the engine (holding `first`'s weights) generates lands between two of its steps, once some
    request has k tokens; every response reports its versions, [(0, 0), (c, 1)] with c its
    tokens before the load (or one version, where it ended before or had not started), and its
    log-probs are `first`'s before c and `second`'s from c on, as a forward over the whole sequence
    gives them: over the caches of the old weights the new ones would give neither."""
    import threading
    import time
    from types import SimpleNamespace

    from reasonrl_fast.config import load_config
    from reasonrl_fast.rollout.handoff import Handoff
    from reasonrl_fast.rollout.vllm import VLLM
    from reasonrl_fast.rollout.worker import RolloutWorker

    w = RolloutWorker(load_config(None, ["rollout.max_new_tokens=24"]), 0, 1, "unused", VLLM())
    w.engine = engine
    new = [(name, p.detach().clone()) for name, p in second.named_parameters()]
    w.transport = SimpleNamespace(receive=lambda meta, version, dtype, bucket, shards: iter(new))
    held, counts = threading.Event(), []

    class AtStep(Handoff):
        """Holds the generation at the first step where a request has k tokens until the load
        waits, so that it lands there."""

        def between_tokens(self, t):
            if max(t) >= k and not held.is_set():
                held.set()
                counts.extend(t)
                deadline = time.monotonic() + 30
                while not self._loading and time.monotonic() < deadline:
                    time.sleep(0.001)
            return super().between_tokens(t)

    w.handoff = AtStep()
    seeds = sample_seeds(3, 1, 0, len(prompts) * 4)
    out = {}
    gen = threading.Thread(target=lambda: out.update(r=w.sample_timed(prompts, 4, 1.0, 1.0, seeds)))
    gen.start()
    assert held.wait(60), "the generation never reached k tokens"
    load = threading.Thread(target=lambda: out.update(v=w.receive_weights([], "float32", 1, 1)))
    load.start()
    gen.join(120), load.join(120)
    assert not gen.is_alive() and not load.is_alive() and out.get("v") == 1, out
    tokens, logprobs, versions, _ = out["r"]
    assert len(counts) == len(tokens)
    partial = 0
    for i, (toks, lps, sp, c) in enumerate(zip(tokens, logprobs, versions, counts)):
        want = [(0, 0), (c, 1)] if 0 < c < len(toks) else [(0, 1)] if c == 0 else [(0, 0)]
        assert sp == want, (i, sp, c, len(toks))
        partial += len(sp) == 2
        ref = torch.cat([teacher_forced(first, prompts[i // 4], toks, 1.0)[:c],
                         teacher_forced(second, prompts[i // 4], toks, 1.0)[c:]])
        err = (torch.tensor(lps, dtype=torch.float64) - ref).abs().max().item()
        assert err < 1e-4, ("mid-generation load", i, c, err)
    assert partial, f"no response was in flight when the load landed: {counts}, {[len(t) for t in tokens]}"
    # the next generation samples version 1 from its first token
    assert w.sample_timed(prompts, 1, 1.0, 1.0, seeds[:3])[2] == [[(0, 1)]] * 3


def main(work: str) -> None:
    torch.set_num_threads(1)
    first, second = model(0), model(1)
    path = os.path.join(work, "tiny")
    first.save_pretrained(path)
    # 64 blocks of 128 tokens at 2 x 2 layers x 2 kv heads x 32 x 4 bytes a token: every sample below at once
    engine = VLLMEngine(path, torch.float32, EOS, max_model_len=96, seed=0, device=torch.device("cpu"),
                         log_path=os.path.join(work, "vllm.log"), kv_cache_memory_bytes=64 * 128 * 1024)
    prompts = [[5, 9, 11], [7], [3, 4, 5, 6, 7, 8]]
    seeds = sample_seeds(0, 1, 0, 12)

    # 1. shapes, EOS, and log-probs: the sampler's equal the model's under the sampling distribution
    for temperature, top_p in [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9)]:
        out = engine.generate(prompts, 4, temperature, top_p, 24, seeds)
        assert len(out.tokens) == 12 and [len(x) for x in out.logprobs] == [len(x) for x in out.tokens]
        for i, (toks, lps) in enumerate(zip(out.tokens, out.logprobs)):
            assert 1 <= len(toks) <= 24 and (len(toks) == 24 or toks[-1] == EOS) and EOS not in toks[:-1], toks
            want = teacher_forced(first, prompts[i // 4], toks, temperature, top_p)
            err = (torch.tensor(lps, dtype=torch.float64) - want).abs().max().item()
            assert err < 1e-4, (temperature, top_p, i, err)
    print("log-probs: the model's under the sampling distribution", flush=True)
    assert any(t[-1] == EOS for t in out.tokens), "no response ended with EOS"

    # 2. seeds: the same seeds give the same samples, other seeds others
    a = engine.generate(prompts, 4, 1.0, 1.0, 24, seeds).tokens
    assert engine.generate(prompts, 4, 1.0, 1.0, 24, seeds).tokens == a
    assert engine.generate(prompts, 4, 1.0, 1.0, 24, sample_seeds(1, 1, 0, 12)).tokens != a
    # a sample alone draws what it drew in the batch
    assert engine.generate([prompts[1]], 1, 1.0, 1.0, 24, [seeds[5]]).tokens[0] == a[5]
    print("seeds: reproducible, distinct, independent of the batch", flush=True)
    # a length limit per prompt (rollout.max_sequence_tokens): each request stops at its own
    cut = engine.generate(prompts, 4, 1.0, 1.0, [3, 24, 1], seeds).tokens
    assert cut == [t[:limit] for t, limit in zip(a, [3] * 4 + [24] * 4 + [1] * 4)], (cut, a)
    print("length limits: one per prompt", flush=True)

    # 3. weight sync: all-zero weights give every token log-prob -log V exactly
    engine.load_weights((name, torch.zeros_like(p)) for name, p in first.named_parameters())
    zero = engine.generate(prompts, 2, 1.0, 1.0, 8, seeds[:6])
    flat = [lp for row in zero.logprobs for lp in row]
    assert flat and all(abs(lp + math.log(V)) < 1e-5 for lp in flat), flat[:5]
    # ... and the second model's weights give the second model's log-probs
    engine.load_weights((name, p.detach().clone()) for name, p in second.named_parameters())
    out = engine.generate(prompts, 4, 1.0, 1.0, 24, seeds)
    for i, (toks, lps) in enumerate(zip(out.tokens, out.logprobs)):
        err = (torch.tensor(lps, dtype=torch.float64) - teacher_forced(second, prompts[i // 4], toks, 1.0)).abs().max()
        assert err < 1e-4, ("after sync", i, float(err))
    # ... and back to the first: its samples again, seed for seed (no stale prefix cache)
    engine.load_weights(first.named_parameters())
    assert engine.generate(prompts, 4, 1.0, 1.0, 24, seeds).tokens == a
    print("weight sync: the engine follows the loaded weights exactly", flush=True)

    # 4. greedy: the model's argmax path, log-probs reported as 0
    g = engine.generate(prompts, 1, 0.0, 1.0, 10, seeds[:3])
    for p, toks, lps in zip(prompts, g.tokens, g.logprobs):
        ids = list(p)
        with torch.no_grad():
            for _ in range(len(toks)):
                ids.append(int(first(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
        assert ids[len(p):] == toks and set(lps) == {0.0}, (ids[len(p):], toks)
    print("greedy: the model's argmax", flush=True)

    # 5. stop strings (multi-turn rollouts): the engine stepped, a request aborted where its text
    # first ends with one, its tokens and log-probs those of the generation without the stop
    stop_strings(engine, prompts, seeds)
    print("stop strings: each request ends where its text first ends with one", flush=True)

    # 6. weights that land mid-generation (split placement's partial rollouts)
    partial_rollouts(engine, first, second, prompts)
    print("mid-generation load: each token from one version, the caches recomputed", flush=True)

    engine.close()
    log = open(os.path.join(work, "vllm.log")).read()
    assert "reload" in log.lower(), log[-500:]  # vLLM's own log went to the file
    print("ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
