"""Multi-turn rollouts (rollout/turns.py): stop strings end a row in the hf sampler exactly where
its text first ends with one; a sample's turns, its tool observations spliced in with mask 0 and
log-prob 0, the token budget counting both, rollout.max_turns bounding the calls, and each turn's
seed; with a scripted engine so that every token is known."""

import numpy as np
import pytest
import torch

from reasonrl_fast.models.tiny import char_tokenizer
from reasonrl_fast.rollout.base import Samples
from reasonrl_fast.rollout.hf import HFEngine
from reasonrl_fast.rollout.turns import StopStrings, multi_turn
from reasonrl_fast.tools.box import ToolBox
from reasonrl_fast.tools.calls import FORMATS
from reasonrl_fast.util import derive_seed
from tests.rollout.test_engines import EOS, PAD, _model, _prompts


def _letters(ids):
    return "".join(chr(ord("a") + i % 26) for i in ids)


def test_the_hf_sampler_ends_a_row_where_its_text_first_ends_with_a_stop_string():
    rng = np.random.default_rng(torch.initial_seed() % 2**32)
    prompts = _prompts(rng, 24)
    stops = ["c", "de"]
    stop = StopStrings(stops, _letters, len(prompts), EOS)
    engine = HFEngine(_model(0), PAD, EOS, torch.device("cpu"))
    out = engine.generate(prompts, 1, 1.0, 1.0, 14, list(range(len(prompts))), stop=stop)
    free = engine.generate(prompts, 1, 1.0, 1.0, 14, list(range(len(prompts))))
    ended = 0
    for toks, whole, end in zip(out.tokens, free.tokens, stop.ends):
        first = next((k for k in range(1, len(whole) + 1) if EOS not in whole[:k - 1]
                      and any(_letters([t for t in whole[:k] if t != EOS]).endswith(s) for s in stops)
                      and whole[k - 1] != EOS), None)
        if first is not None:  # the same draws up to the stop: each token's seed is its own
            assert end == first and toks == whole[:first], (toks, whole, end)
            ended += 1
        else:
            assert end is None and toks == whole
    assert ended >= 3, "too few rows met a stop string to test it"


class Scripted:
    """An engine whose rows say what the script gives for (prompt's first token, turn), fed through
    `stop` token by token as a real engine's would be; records its calls."""

    def __init__(self, tok, script):
        self.tok, self.script, self.calls = tok, script, []

    def generate(self, prompts, n, temperature, top_p, limits, seeds, stop=None):
        assert n == 1
        self.calls.append((len(prompts), list(limits), list(seeds)))
        out = Samples()
        for row, (p, limit) in enumerate(zip(prompts, limits)):
            key = self.tok.decode(p[:1])
            ids = self.tok.encode(self.script[key][turn_of(p, self.tok)], add_special_tokens=False)[:limit]
            kept = []
            for t in ids:
                kept.append(t)
                if stop is not None and stop.feed(row, t):
                    break
            out.tokens.append(kept)
            out.logprobs.append([-0.5] * len(kept))
        return out


def turn_of(context, tok) -> int:
    """The turn a context asks for: one more than the observations in it."""
    return tok.decode(context).count("</result>")


@pytest.mark.proc  # the tool box's worker process
def test_turns_observations_masks_budgets_and_seeds():
    tok = char_tokenizer()
    eos = tok.eos_token
    script = {  # prompt's first character -> each turn's text
        "a": ["<calculator>37*48</calculator>", "\\boxed{1776}" + eos],
        "b": ["\\boxed{6}" + eos],
        "c": ["<calculator>1/0</calculator>", "<calculator>2+2</calculator>", "<calculator>3</calculator>", "x"],
        "d": ["<calculator>99*99</calculator>", "never"],
    }
    engine = Scripted(tok, script)
    prompts = [tok.encode(p, add_special_tokens=False) for p in ["a=", "b=", "c=", "d="]]
    limits = [80, 40, 200, 34]  # d: 30 tokens of call, then room for 4 of its observation
    seeds = [11, 12, 13, 14]
    with ToolBox(["calculator"]) as box:
        done = multi_turn(engine.generate, prompts, 1, 1.0, 1.0, limits, seeds, box, FORMATS["plain"], tok, 2)
    s = done.samples
    text = [tok.decode(t, skip_special_tokens=False) for t in s.tokens]
    assert text[0] == "<calculator>37*48</calculator><result>1776</result>\\boxed{1776}" + eos
    assert text[1] == "\\boxed{6}" + eos
    # max_turns=2: two calls answered, the third turn's call unanswered, no fourth turn
    assert text[2] == ("<calculator>1/0</calculator><result>error: ValueError: division by zero</result>"
                       "<calculator>2+2</calculator><result>4</result><calculator>3</calculator>")
    assert text[3] == "<calculator>99*99</calculator><res" and len(s.tokens[3]) == 34  # the budget cut it
    for t, m, lp, txt in zip(s.tokens, s.masks, s.logprobs, text):
        assert len(m) == len(t) == len(lp)
        policy = tok.decode([x for x, k in zip(t, m) if k], skip_special_tokens=False)
        assert "<result>" not in policy and all((k == 1) == (v == -0.5) for k, v in zip(m, lp))
    assert tok.decode([x for x, k in zip(s.tokens[0], s.masks[0]) if not k]) == "<result>1776</result>"
    assert done.turns == [2, 1, 3, 1]
    m = done.metrics
    assert m["tool/calls_per_sample"] == 4 / 4 and m["tool/error_frac"] == 1 / 4 and m["rollout/turns_mean"] == 7 / 4
    assert m["tool/timeout_frac"] == 0 and m["tool/seconds_mean"] > 0
    assert m["rollout/policy_token_frac"] == sum(map(sum, s.masks)) / sum(map(len, s.masks))
    # each turn samples the samples still going, with its budget left and its seed
    assert [c[0] for c in engine.calls] == [4, 2, 1]
    assert engine.calls[0][2] == seeds and engine.calls[1][2] == [derive_seed(11, "turn", 1), derive_seed(13, "turn", 1)]
    assert engine.calls[1][1] == [80 - len("<calculator>37*48</calculator><result>1776</result>"),
                                  200 - len("<calculator>1/0</calculator><result>error: ValueError: division by "
                                            "zero</result>")]
