"""Partial rollouts (rollout/handoff.py): new weights that land between two tokens of a generation in
flight. The sampler recomputes its cache under them, so each token's sampler log-prob is exactly
the log-prob of the one version's policy that drew it, and the rollout worker reports the versions
of each response's tokens; a weight load never runs inside a token's step."""

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from reasonrl_fast.rollout.handoff import Handoff, spans
from reasonrl_fast.rollout.hf import HF, HFEngine
from reasonrl_fast.rollout.lean import LeanDecoder
from reasonrl_fast.rollout.sampling import _keep_top_p, sample
from reasonrl_fast.trainer.cluster import Pending
from tests.rollout.test_engines import PAD, _left_pad, _model, _prompts

T, TOP_P = 1.3, 0.9


def _teacher_forced(model, prompts, responses) -> list[list[float]]:
    """log p(response token | prompt, tokens before it) under `model`, tempered and cut to the
    nucleus as the sampler draws: one forward over the whole left-padded sequence, no cache."""
    ids, attn = _left_pad([p + r for p, r in zip(prompts, responses)])
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.double() / T
    out = []
    for b, (p, r) in enumerate(zip(prompts, responses)):
        start = ids.shape[1] - len(p) - len(r)  # the row's first real position
        rows = _keep_top_p(logits[b, start + len(p) - 1:start + len(p) + len(r) - 1], TOP_P).log_softmax(-1)
        out.append(rows.gather(-1, torch.tensor(r)[:, None]).squeeze(1).tolist())
    return out


def _rng():
    return np.random.default_rng(torch.initial_seed() % 2**32)


@pytest.mark.parametrize("lean", [False, True])
def test_tokens_after_an_update_are_drawn_from_the_new_policy_exactly(lean):
    """Weights replaced before token k: tokens < k have the old policy's log-probs, tokens >= k
    the new policy's, each as a forward over the whole sequence gives it (the cache recomputed:
    over the old cache the new weights would give neither)."""
    old, new = _model(0), _model(1)
    model = _model(0)  # the engine's copy, whose weights change mid-generation
    prompts = _prompts(_rng(), 5)
    ids, attn = _left_pad(prompts)
    k = int(_rng().integers(2, 9))
    switched = []

    def between_tokens(t: int) -> bool:
        if t != k:
            return False
        model.load_state_dict(new.state_dict())
        switched.append(t)
        return True

    toks, lps = sample(model, ids, attn, T, TOP_P, 14, eos_id=-1, pad_id=PAD,
                       lean=LeanDecoder(model) if lean else None, seeds=torch.arange(5) + 7,
                       between_tokens=between_tokens)
    assert switched == [k] and toks.shape == (5, 14)
    responses = toks.tolist()
    ref_old, ref_new = _teacher_forced(old, prompts, responses), _teacher_forced(new, prompts, responses)
    got = lps.double()
    want = torch.tensor([o[:k] + n[k:] for o, n in zip(ref_old, ref_new)], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # the sampler works in float32
    # the two policies differ where it matters: the test would see a token drawn from the wrong one
    assert (torch.tensor(ref_old)[:, k:] - torch.tensor(ref_new)[:, k:]).abs().max() > 1e-2


def test_a_rollout_worker_loads_weights_mid_generation_and_reports_each_tokens_version():
    """The rollout worker's two threads as Ray runs them in split placement (its generation, and
    `receive_weights` in a concurrency group of its own): a load published while a generation runs
    lands at the next token, the generation goes on under it, and every response reports
    versions [(0, 0), (k, 1)]; the log-probs are the two policies' (as above); the next generation
    samples version 1 from its first token."""
    from reasonrl_fast.config import load_config
    from reasonrl_fast.rollout.worker import RolloutWorker

    threads = torch.get_num_threads()
    cfg = load_config(None, ["rollout.max_new_tokens=12"])
    w = RolloutWorker(cfg, 0, 1, "unused", HF())
    torch.set_num_threads(threads)  # the constructor sets the process's; this one is pytest's
    old_lm, new_lm = _model(0), _model(1)
    w.engine = HFEngine(old_lm, PAD, -1, torch.device("cpu"))  # no EOS: every row is 12 tokens
    new_weights = list(HFEngine(new_lm, PAD, -1, torch.device("cpu")).params.items())
    received = []
    w.transport = SimpleNamespace(receive=lambda meta, version, dtype, bucket, shards:
                                  received.append(version) or iter(new_weights))
    k = int(_rng().integers(2, 9))
    at_k = threading.Event()

    class AtToken(Handoff):
        """Holds the generation at token k until the load is waiting, so that it lands there."""

        def between_tokens(self, t):
            if t == k and not at_k.is_set():  # the first generation's
                at_k.set()
                deadline = time.monotonic() + 30
                while not self._loading and time.monotonic() < deadline:
                    time.sleep(0.001)
            return super().between_tokens(t)

    w.handoff = AtToken()
    prompts = _prompts(_rng(), 3)
    out = {}
    gen = threading.Thread(target=lambda: out.update(r=w.sample_timed(prompts, 2, T, TOP_P, list(range(6)))))
    gen.start()
    assert at_k.wait(30)
    load = threading.Thread(target=lambda: out.update(v=w.receive_weights([], "float64", 1, 1)))
    load.start()
    gen.join(60), load.join(60)
    assert not gen.is_alive() and not load.is_alive()
    tokens, logprobs, versions, _ = out["r"]
    assert out["v"] == 1 and received == [1] and w.version == 1
    assert versions == [[(0, 0), (k, 1)]] * 6
    rep = [p for p in prompts for _ in range(2)]
    ref_old, ref_new = _teacher_forced(old_lm, rep, tokens), _teacher_forced(new_lm, rep, tokens)
    want = torch.tensor([o[:k] + n[k:] for o, n in zip(ref_old, ref_new)], dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(logprobs, dtype=torch.float64), want, rtol=0, atol=1e-5)  # the sampler works in float32
    # the driver's view: staleness over tokens against the trainer's version 1, half the rows partial
    p = Pending([], [], 2, 0, prompts, tokens, logprobs, versions)
    m = p.staleness(1)
    assert m["rollout/staleness_max"] == 1 and m["rollout/staleness_mean"] == pytest.approx(k / 12)
    assert m["rollout/partial_frac"] == 1.0
    # the next generation: version 1 from its first token
    assert w.sample_timed(prompts, 1, T, TOP_P, [0, 1, 2])[2] == [[(0, 1)]] * 3


def test_a_load_waits_for_a_tokens_step_and_a_generation_for_a_load():
    """The engine is never loading and inside a token's step at once: a load with no generation
    runs at once; a generation that starts during a load waits for it and samples the new
    version; a load during a generation lands only at `between_tokens`."""
    h = Handoff()
    with h.loading():
        h.version = 1
        started = threading.Event()

        def generation():
            with h.sampling():
                started.set()

        g = threading.Thread(target=generation)
        g.start()
        assert not started.wait(0.2)  # held by the load
    g.join(10)
    assert started.is_set() and h.switches == [(0, 1)]
    inside = threading.Event()
    release = threading.Event()
    landed = []

    def generation2():
        with h.sampling():
            inside.set()
            release.wait(10)  # a token's step
            landed.append(h.between_tokens(3))

    g = threading.Thread(target=generation2)
    g.start()
    assert inside.wait(10)

    ld, loaded = _start_load(h, 2)
    assert not loaded.wait(0.2)  # the step is not interrupted
    release.set()
    g.join(10), ld.join(10)
    assert loaded.is_set() and landed == [True] and h.switches == [(0, 1), (3, 2)]


def _start_load(h: Handoff, version: int) -> tuple[threading.Thread, threading.Event]:
    """A load of `version` in a thread of its own (as Ray's concurrency group runs it), and the
    event it sets once loaded."""
    loaded = threading.Event()

    def load():
        with h.loading():
            h.version = version
        loaded.set()

    t = threading.Thread(target=load)
    t.start()
    return t, loaded


def test_a_responses_versions_are_the_switches_within_it():
    switches = [(0, 3), (4, 4), (9, 5)]
    assert spans(switches, 12) == switches
    assert spans(switches, 9) == [(0, 3), (4, 4)]
    assert spans(switches, 4) == [(0, 3)]
    assert spans(switches, 0) == [(0, 3)]


def test_an_engine_that_counts_each_rows_tokens_gives_each_response_its_own_switch():
    """vLLM schedules each request on its own and passes every row's count of tokens so far: a
    row in flight at a load switches at its own count; a row that had ended keeps one version; a
    row not started (no token yet) is the new version's alone."""
    switches = [(0, 3), ([4, 7, 0], 4), ([6, 7, 2], 5)]
    assert spans(switches, 10, 0) == [(0, 3), (4, 4), (6, 5)]
    assert spans(switches, 7, 1) == [(0, 3)]  # it ended at its 7th token, before either load
    assert spans(switches, 5, 2) == [(0, 4), (2, 5)]
    assert spans(switches, 1, 2) == [(0, 4)]
    h = Handoff(version=3)
    with h.sampling():
        ld, loaded = _start_load(h, 4)
        deadline = time.monotonic() + 10
        while not h._loading and time.monotonic() < deadline:  # the load waits for the next step
            time.sleep(0.001)
        assert h.between_tokens([4, 7, 0]) and loaded.wait(10)
        assert not h.between_tokens([5, 7, 1])  # no load waiting: the step goes on
    ld.join(10)
    assert h.switches == [(0, 3), ([4, 7, 0], 4)]
    assert [spans(h.switches, n, r) for r, n in enumerate([9, 7, 3])] == [[(0, 3), (4, 4)], [(0, 3)], [(0, 4)]]
