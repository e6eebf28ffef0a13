"""Multi-turn rollouts with tools: the engine samples a turn until it ends with a tool call (a stop
string of the call format, or, for chat formats, the turn's end with calls in it), the rollout
worker's tool box runs the calls (tools/box.py), their observations are appended, and the engine
samples the next turn, up to rollout.max_turns calls and the response's token budget (its length
limit counts the observations too). Samples with different turn counts batch together: each turn
samples every sample still going, as one batch.

A response is then the policy's tokens interleaved with observation tokens, with a mask (1: the
policy's, 0: a tool's or the template's), which the update and the log-prob diagnostics apply
(trainer/policy.py `make_batch`); an observation token's sampler log-prob is 0 and never read.
Each turn draws with the sample's own seed for turn 0 and a seed derived from it for the turns
after (util.py `derive_seed`), so a sample without calls draws exactly what it would without
tools."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from reasonrl_fast.rollout.base import Samples
from reasonrl_fast.util import derive_seed


class StopStrings:
    """An engine's `stop`: fed each row's newest token, it ends a row once the row's text, decoded
    from its last tokens, ends (trailing space aside) with one of `stops`, and keeps in `ends`
    the row's token count there (None: not ended so). A row that sampled `eos_id` is over."""

    def __init__(self, stops: list[str], decode: Callable[[list[int]], str], rows: int, eos_id: int | None):
        self.stops = [s for s in stops if s]
        self.decode, self.eos_id = decode, eos_id
        self.window = max((len(s) for s in self.stops), default=0) + 8  # tokens: each holds a character or more
        self.tails: list[list[int]] = [[] for _ in range(rows)]
        self.counts = [0] * rows
        self.ends: list[int | None] = [None] * rows
        self.over = [False] * rows

    def __call__(self, tokens: list[int]) -> list[bool]:
        """Every row's newest token (the hf sampler's step): which rows end here."""
        return [self.feed(i, t) for i, t in enumerate(tokens)]

    def feed(self, i: int, t: int) -> bool:
        """Row i's next token: whether the row ends with it (an engine that steps its rows apart,
        as vLLM's)."""
        if self.over[i] or self.ends[i] is not None:
            return False
        self.counts[i] += 1
        if t == self.eos_id:
            self.over[i] = True
            return False
        tail = self.tails[i]
        tail.append(t)
        del tail[:-self.window]
        text = self.decode(tail).rstrip()
        if any(text.endswith(s) for s in self.stops):
            self.ends[i] = self.counts[i]
            return True
        return False


@dataclass
class Transcripts:
    """What a multi-turn generation gives: the `Samples` (with `masks`), each sample's turns
    (generations), and the tool metrics of the batch."""

    samples: Samples
    turns: list[int] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)


def multi_turn(generate, prompts: list[list[int]], n: int, temperature: float, top_p: float,
               limits: list[int], seeds: list[int], box, fmt, tok, max_turns: int) -> Transcripts:
    """n samples per prompt (prompt-major) with tool calls: `generate` is the engine's (rollout/base.py
    `Engine.generate`, taking `stop=`), `limits` each prompt's response budget (policy and tool
    tokens), `seeds` each sample's, `box` a ToolBox, `fmt` a call format (tools/calls.py), `tok` the
    tokenizer (decoding turns, encoding observations), `max_turns` the calls a sample may make (the
    turn after its last call may call again: that call goes unanswered and ends the sample)."""
    rep = [p for p in prompts for _ in range(n)]
    budget = [limits[i // n] for i in range(len(rep))]
    tokens: list[list[int]] = [[] for _ in rep]
    lps: list[list[float]] = [[] for _ in rep]
    masks: list[list[int]] = [[] for _ in rep]
    turns = [0] * len(rep)
    stops = fmt.stops(box.names)
    eos = tok.eos_token_id
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    totals = {"tool/calls": 0, "tool/errors": 0, "tool/timeouts": 0, "tool/seconds": 0.0}
    active = list(range(len(rep)))
    for turn in range(max_turns + 1):
        if not active:
            break
        stop = StopStrings(stops, decode, len(active), eos) if stops else None
        out = generate([rep[i] + tokens[i] for i in active], 1, temperature, top_p,
                       [budget[i] - len(tokens[i]) for i in active],
                       [seeds[i] if turn == 0 else derive_seed(seeds[i], "turn", turn) for i in active],
                       **({"stop": stop} if stop is not None else {}))
        calls, callers = [], []
        for j, i in enumerate(active):
            t = out.tokens[j]
            tokens[i] += t
            lps[i] += out.logprobs[j]
            masks[i] += [1] * len(t)
            turns[i] += 1
            if turn == max_turns or len(tokens[i]) >= budget[i]:
                continue  # its last turn: a call here goes unanswered
            made = fmt.parse(decode(t), box.names)
            if made:
                callers.append((i, len(calls), len(made)))
                calls += made
        if not calls:
            break
        runnable = [(c.name, c.arguments) for c in calls if c.problem is None]
        done, m = box.call(runnable)
        for k in totals:
            totals[k] += m[k]
        texts, it = [], iter(done)
        for c in calls:
            texts.append(c.problem if c.problem is not None else next(it).text)
        totals["tool/calls"] += len(calls) - len(runnable)
        totals["tool/errors"] += len(calls) - len(runnable)
        active = []
        for i, first, count in callers:
            obs = tok.encode(fmt.observe(texts[first:first + count], tok), add_special_tokens=False)
            obs = obs[:budget[i] - len(tokens[i])]
            tokens[i] += obs
            lps[i] += [0.0] * len(obs)
            masks[i] += [0] * len(obs)
            if len(tokens[i]) < budget[i]:
                active.append(i)
    return Transcripts(Samples(tokens, lps, masks), turns, turn_metrics(masks, turns, totals))


def turn_metrics(masks: list[list[int]], turns: list[int], totals: dict) -> dict:
    """The batch's multi-turn metrics (docs/trainer.md §Metrics): rates, so that the workers'
    means are the step's."""
    calls = max(totals["tool/calls"], 1)
    return {"rollout/turns_mean": sum(turns) / max(len(turns), 1),
            "rollout/policy_token_frac": sum(map(sum, masks)) / max(sum(map(len, masks)), 1),
            "tool/calls_per_sample": totals["tool/calls"] / max(len(turns), 1),
            "tool/error_frac": totals["tool/errors"] / calls, "tool/timeout_frac": totals["tool/timeouts"] / calls,
            "tool/seconds_mean": totals["tool/seconds"] / calls}
