"""New weights that land between two tokens of a generation (split placement's partial rollouts).

A rollout worker's generation and its weight loads run in two threads of its Ray actor (the loads
in a concurrency group of their own, cluster.py). An engine that can take weights mid-generation
(`EngineSpec.between_tokens`: the hf engine, and vLLM's of one process) asks `between_tokens`
after every token; when a load waits, the generation pauses there, the load runs, and the
generation goes on under the new weights, the engine recomputing its cache from the tokens so far
(rollout/sampling.py `sample`; vLLM preempts its running requests, rollout/vllm.py), so that every
token is drawn from exactly one version's policy and its sampler log-prob is that policy's. An
engine that cannot (a tensor-parallel vLLM engine) never asks: a load waits for the generation to
end.

The hf engine's rows advance together, so it names the next token by one index; vLLM schedules
each request on its own (some wait for room in the cache, some end early), so it passes each
request's count of tokens so far.

`Handoff` records where each generation's versions change, so each sample carries the versions
of its tokens (`spans`)."""

from __future__ import annotations

import threading
from contextlib import contextmanager


class Handoff:
    """The engine is either sampling (one generation at a time) or loading weights (one load
    at a time), never both; a waiting load is let in at the next token boundary."""

    def __init__(self, version: int = 0):
        self._cv = threading.Condition()
        self._sampling = False
        self._loading = False
        self.version = version
        # the running generation's (first token, version): the token's index in every row, or each row's
        self.switches: list[tuple[int | list[int], int]] = []
        self.generating = False  # a generation is running (paused at a boundary included)

    @contextmanager
    def loading(self):
        """Around a weight load: waits until no generation is inside a token's step."""
        with self._cv:
            self._cv.wait_for(lambda: not self._loading)
            self._loading = True
            self._cv.wait_for(lambda: not self._sampling)
        try:
            yield
        finally:
            with self._cv:
                self._loading = False
                self._cv.notify_all()

    @contextmanager
    def sampling(self):
        """Around a generation: waits for a load in progress, then records its versions from
        the one loaded now."""
        with self._cv:
            self._cv.wait_for(lambda: not self._loading)
            self._sampling = self.generating = True
            self.switches = [(0, self.version)]
        try:
            yield
        finally:
            with self._cv:
                self._sampling = self.generating = False
                self._cv.notify_all()

    def between_tokens(self, t: int | list[int]) -> bool:
        """Called by the engine before it computes token `t` of the running generation (or of each
        row, a list in the engine's order of samples): True when a load was let in here (the
        weights changed: token t on is drawn from the new ones)."""
        with self._cv:
            if not self._loading:
                return False
            self._sampling = False
            self._cv.notify_all()
            self._cv.wait_for(lambda: not self._loading)
            self._sampling = True
            if self.version == self.switches[-1][1]:
                return False
            if self.switches[-1][0] == t:  # two loads at one boundary: the last one samples
                self.switches[-1] = (t, self.version)
            else:
                self.switches.append((t, self.version))
            return True


def spans(switches: list[tuple[int | list[int], int]], length: int, row: int = 0) -> list[tuple[int, int]]:
    """The (first token, version) pairs of row `row`'s response, `length` tokens long, from its
    generation's switches: the first, and those that start within it; of two that start at one
    token (a row that had not started when a load landed), the later."""
    out: list[tuple[int, int]] = []
    for first, version in switches:
        at = first if isinstance(first, int) else first[row]
        if out and at >= length:
            continue
        if out and out[-1][0] == at:
            out[-1] = (at, version)
        else:
            out.append((at, version))
    return out

