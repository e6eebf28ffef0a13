"""How a tool call is written in a response, and how its observation follows it: a registry of
call formats (`FORMATS`, `rollout.tool_format`), each with the strings that end a turn with a
call, the reading of a turn's calls, and the rendering of their observations.

- `plain`: `<NAME>ARGUMENT</NAME>`, answered `<result>TEXT</result>` (Search-R1's form): for a model
  without a chat template (the embedded tiny model). The turn ends at `</NAME>`; ARGUMENT fills
  the tool's first argument.
- `hermes`: Qwen2.5/Qwen3's (and Hermes') `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  JSON, one block per call, at the end of an assistant turn that the model ends with its EOS
  token; the observations are tool messages rendered by the tokenizer's own chat template, with
  the next assistant turn's header (`observe`).

A turn's calls are read from its text only: the format never executes anything, and a
malformed call is a `Call` with a `problem` the policy is told (an error observation)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

MAX_CALLS = 8
"""Calls read from one turn; more are one error observation."""
MAX_JSON_CHARS = 20000
"""The longest `<tool_call>` block read."""


@dataclass
class Call:
    """A call read from a turn: the tool's name and its arguments (a dict of keyword arguments,
    or one string for the tool's first argument), or the `problem` that keeps it from being made."""

    name: str
    arguments: dict | str | None = None
    problem: str | None = None


class Plain:
    """`<NAME>ARGUMENT</NAME>` -> `<result>TEXT</result>`."""

    name = "plain"
    OPEN, CLOSE = "<result>", "</result>"

    def stops(self, tools: list[str]) -> list[str]:
        """What ends a turn that calls a tool (besides EOS, which ends the answer)."""
        return [f"</{t}>" for t in tools]

    def parse(self, turn: str, tools: list[str]) -> list[Call]:
        """The call a turn ends with: `<NAME>ARGUMENT</NAME>` at its end ([] when it ends
        otherwise: the answer is final), trailing space aside (a token may hold the tag and a
        newline)."""
        turn = turn.rstrip()
        for t in tools:
            end = f"</{t}>"
            if turn.endswith(end):
                start = turn.rfind(f"<{t}>", 0, len(turn) - len(end))
                if start < 0:
                    return [Call(t, problem=f"error: {end} without <{t}> before it")]
                return [Call(t, turn[start + len(t) + 2:len(turn) - len(end)])]
        return []

    def observe(self, texts: list[str], tok=None) -> str:
        """The text that follows the turn: each observation in `<result>...</result>`."""
        return "".join(f"{self.OPEN}{t}{self.CLOSE}" for t in texts)


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class Hermes:
    """`<tool_call>{"name": NAME, "arguments": {...}}</tool_call>` blocks in an assistant turn ->
    tool messages in the chat template's rendering."""

    name = "hermes"

    def stops(self, tools: list[str]) -> list[str]:
        return []  # the model ends its turn with EOS after its calls, as these templates train it to

    def parse(self, turn: str, tools: list[str]) -> list[Call]:
        blocks = _TOOL_CALL.findall(turn)
        if len(blocks) > MAX_CALLS:
            return [Call("", problem=f"error: {len(blocks)} tool calls in one turn (at most {MAX_CALLS})")]
        return [self._call(b.strip()) for b in blocks]

    def _call(self, block: str) -> Call:
        if len(block) > MAX_JSON_CHARS:
            return Call("", problem=f"error: a tool call of {len(block)} characters (at most {MAX_JSON_CHARS})")
        try:
            call = json.loads(block)
        except (ValueError, RecursionError) as e:
            return Call("", problem=f"error: the tool call is not JSON ({str(e)[:100]})")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return Call("", problem='error: a tool call is {"name": ..., "arguments": {...}}')
        args = call.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return Call(call["name"], problem=f"error: the arguments of {call['name'][:80]} are not a JSON object")
        if not isinstance(args, dict):
            return Call(call["name"], problem=f"error: the arguments of {call['name'][:80]} are not a JSON object")
        return Call(call["name"], args)

    def observe(self, texts: list[str], tok=None) -> str:
        """The tool messages as the tokenizer's chat template renders them after an assistant
        turn (which the response already holds, ended by its EOS token), and the next assistant
        turn's header: the template's text from the end of that turn on."""
        return template_continuation(tok, [{"role": "tool", "content": t} for t in texts])


_MARK = "\u2063TURN\u2063"  # text no tool output holds, to find the end of the assistant turn by


def template_continuation(tok, messages: list[dict]) -> str:
    """What `tok`'s chat template renders after an assistant turn for `messages` (tool results),
    up to the next assistant turn's header: the text between the assistant's turn end (its EOS
    token, which the response holds) and the next turn. A ValueError when the template does not
    render the assistant turn as its content followed by the EOS token."""
    if tok is None or not getattr(tok, "chat_template", None):
        raise ValueError("the hermes tool format renders observations with the tokenizer's chat template, "
                         "and this tokenizer has none: use rollout.tool_format=plain")
    convo = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARK}]
    text = tok.apply_chat_template(convo + messages, tokenize=False, add_generation_prompt=True)
    end = text.rfind(_MARK) + len(_MARK)
    eos = tok.eos_token or ""
    if end < len(_MARK) or not text.startswith(eos, end):
        raise ValueError(f"the chat template does not end an assistant turn with the EOS token {eos!r}: "
                         f"its tool messages cannot follow a sampled turn")
    return text[end + len(eos):]


FORMATS = {"plain": Plain(), "hermes": Hermes()}
"""The call formats by `rollout.tool_format`."""
