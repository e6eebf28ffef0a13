"""What every rollout engine shares: the interface a rollout worker (rollout/worker.py) samples
through (`Engine`, what an engine's spec builds, rollout/registry.py `EngineSpec`), and the one rule
that turns (run seed, stream, sample index) into a sample's own sampling seed.

Every sample carries its own seed, so what a sample draws depends on the run's seed, the step
(or eval batch) and the sample's place in it, and on nothing else: not on how many workers share
the step, how the engine batches requests, or which other samples run beside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from reasonrl_fast.util import derive_seed

if TYPE_CHECKING:  # annotations only: the engines' specs and the seed rule load without torch
    import torch


@dataclass
class Samples:
    """n samples per prompt, prompt-major: each response's token ids (ending with EOS unless cut
    at its length limit) and the sampler's own log-prob of each of those tokens, under the
    distribution it drew the token from (temperature and top-p applied). `masks`: with tools
    (rollout/turns.py), each token's 1 (the policy's) or 0 (a tool's observation, log-prob 0);
    empty: every token is the policy's."""

    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    masks: list[list[int]] = field(default_factory=list)


class Engine:
    """A built engine: it samples, takes new weights, and sleeps through the update."""

    def generate(self, prompts: list[list[int]], n: int, temperature: float, top_p: float,
                 max_new_tokens: int | list[int], seeds: list[int]) -> Samples:
        """n samples per prompt, prompt-major; `seeds` holds one sampling seed per sample
        (len(prompts) * n, see `sample_seeds`); `max_new_tokens`: the longest response, or one
        limit per prompt (rollout.max_sequence_tokens). An engine whose spec has
        `weights_between_tokens` also takes `between_tokens=` (rollout/handoff.py). `stop=` (a
        rollout/turns.py `StopStrings`): rows also end where it says, their tokens kept."""
        raise NotImplementedError

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights (names as in the Hugging Face model), waking it first if
        it sleeps; the tensors may be freed as soon as each is consumed."""
        raise NotImplementedError

    def sleep(self) -> None:
        """Free the engine's memory while the trainer updates (where the device supports it)."""

    def wake(self) -> None:
        """Undo `sleep` before the weights are loaded."""

    def close(self) -> None:
        """Release the engine (its memory, threads and any processes it started)."""


GREEDY_BELOW = 1e-5
"""Below this temperature every sampler of the project decodes greedily: dividing logits by a
tiny temperature overflows to inf, and sampling from the NaN probabilities fails."""

def sample_seed(seed: int, stream: int | str, index: int) -> int:
    """The sampling seed of sample `index` of `stream` (a training step, a validation pass, an
    eval batch) in a run seeded `seed` (util.py `derive_seed`)."""
    return derive_seed(seed, stream, index)


def sample_seeds(seed: int, stream: int | str, start: int, count: int) -> list[int]:
    """`sample_seed` of samples start .. start + count - 1."""
    return [sample_seed(seed, stream, i) for i in range(start, start + count)]
