"""A third rollout engine for the tests, registered in one place
(`ROLLOUTS["fake"] = "tests.helpers.fake_rollout:FakeSpec"`): it answers every prompt with the
same text, ANSWER, then EOS, through the Engine interface (rollout/base.py). It loads the model directory's
tokenizer, not its weights, so eval builds it without a copy of the policy."""

from __future__ import annotations

from reasonrl_fast.rollout.base import Engine, Samples
from reasonrl_fast.rollout.registry import EngineSpec

ANSWER = "\\boxed{0}"
VERSION = "fixed answers 1.0"


class FixedEngine(Engine):
    def __init__(self, ids: list[int], eos_id: int):
        self.ids, self.eos_id = ids, eos_id

    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seeds):
        if len(seeds) != len(prompts) * n:
            raise ValueError(f"FixedEngine.generate: {len(seeds)} seeds for {len(prompts) * n} samples")
        tokens = (self.ids + [self.eos_id])[:max_new_tokens]
        return Samples([list(tokens) for _ in seeds], [[0.0] * len(tokens) for _ in seeds])

    def load_weights(self, named_tensors):
        for _ in named_tensors:  # consumed, as the interface asks; the answers do not depend on them
            pass


class FakeSpec(EngineSpec):
    name = "fake"
    label = "fixed-answer"

    def preflight(self, architectures=None):
        return VERSION

    def build(self, cfg, layout, lm, model_path, tok, log=print, *, device=None, log_path=None):
        if lm is not None:
            raise ValueError("FakeSpec.build: given a copy of the policy it did not ask for")
        return FixedEngine(tok.encode(ANSWER, add_special_tokens=False), tok.eos_token_id)
