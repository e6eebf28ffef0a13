"""A third rollout engine for the tests, registered in one place
(`ROLLOUTS["fake"] = "tests.helpers.fake_rollout:FakeRollout"`): it answers every prompt with the
same text, ANSWER, then EOS, through the RolloutEngine interface. It loads the model directory's
tokenizer, not its weights, so eval builds it without a copy of the policy."""

from __future__ import annotations

from reasonrl_fast.rollout.base import RolloutEngine, Samples
from reasonrl_fast.rollout.registry import Rollout

ANSWER = "\\boxed{0}"
VERSION = "fixed answers 1.0"


class FixedEngine(RolloutEngine):
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


class FakeRollout(Rollout):
    name = "fake"
    label = "fixed-answer"

    def preflight(self, architectures=None):
        return VERSION

    def build(self, cfg, lm, model_path, pad_id, eos_id, device, dtype, kv_bytes, log_path, log):
        from reasonrl_fast.models.loading import load_tokenizer

        if lm is not None:
            raise ValueError("FakeRollout.build: given a copy of the policy it did not ask for")
        ids = load_tokenizer(model_path).encode(ANSWER, add_special_tokens=False)
        return FixedEngine(ids, eos_id)
