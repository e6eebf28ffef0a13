"""The GenRM wire format (FAPO, docs/fapo.md): what the GenRM is asked, how its answer is read,
and the request/response types the server, its backends and the client share. It sits below
data/, rewards/, tasks/ and genrm/, which all speak it, and holds no server or client code.

The GenRM sees a problem, its reference answer and a solution split into steps numbered from 0,
and answers with the index of the earliest wrong step inside \\boxed{}, or -1 when every step
is right. Three renderings of these fields (`TEMPLATES`):
- "fapo": our full instruction, for real models (steps are the solution's paragraphs);
- "compact": `problem+answer|step|step|`, for the embedded model, whose character tokenizer
  and 256 positions cannot hold the full one (steps are the addition task's columns);
- "published": the prompt the published FAPO-GenRM-4B was trained and run with, the raw
  solution in it (no step marks: the model splits it itself).
Each template has its verdict rule (`VERDICT_RULES`, read by `parse_verdict`): an index in range
for ours, the published run's "any integer but -1 flags" for "published". `parse_request` reads
"fapo" and "compact" back (the rule judge uses it) and refuses "published" by name.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any, Callable, Protocol
from urllib.parse import urlsplit

from reasonrl_fast.redact import redact_url
from reasonrl_fast.util import extract_boxed

API_KEY_ENV = "REASONRL_FAST_GENRM_API_KEY"
"""Where the server and the client read the API key when none is given (it stays out of `ps`)."""

TEMPLATES = ("fapo", "compact", "published")

LAST_USER_CHAT_TEMPLATE = "{{ (messages | selectattr('role', 'equalto', 'user') | list | last)['content'] }}"
"""A chat template that renders what our server gives a model whose tokenizer has no chat template
(the embedded one): the last user message's text as it is, with no role markers and no generation
prompt. vLLM refuses chat requests for such a tokenizer (transformers has no default template),
so `vllm serve --chat-template` takes this one to see the prompts our server and the trainer see."""

_FAPO = """You are given a math problem, its reference answer, and a proposed solution split into \
steps numbered from 0.

[Problem]
{problem}

[Reference answer]
{answer}

[Solution]
{steps}

Check the steps in order. If a step contains an error (a wrong calculation, a false claim, or an \
unjustified conclusion), give the index of the earliest wrong step; if every step is correct, \
give -1. Put the index in \\boxed{{}}."""

_STEP = "<step_{i}>\n{text}\n</step_{i}>"

# The published FAPO run's GenRM prompt, verbatim: verl recipe/fapo/reward_fn_reasoning.py,
# FAPO_GENRM_TEMPLATE (the same text is reward_fn_reasoning_remote.py's QUERY_TEMPLATE_PRM_GT),
# which FAPO-GenRM-4B was trained on. There it is filled by str.format with the question, the
# ground truth and the policy's whole response as they are: no step marks, nothing stripped.
# The same file asks the GenRM with GRM_SAMPLING_PARAMS = {"max_new_tokens": 16384} and nothing
# else (sampled with the server's defaults, not greedy), and reads the answer with the rule of
# `_flag_verdict` below.
_PUBLISHED = (
    "The following is a math problem with its ground truth answer, along with an AI solution (split into steps):\n\n"
    "[Math Problem]\n\n{problem}\n\n"
    "[Ground Truth]\n\n{ground_truth}\n\n"
    "[AI Solution]\n\n{solution}\n\n"
    "Your task is to review and critique the solution step by step. "
    "Once you identify an error in a step, return the index of the step where the earliest error occurs. "
    "Otherwise, return the index of -1 (which typically denotes 'not found').\n\n"
    "Please reason step by step, put your final answer (i.e., the index) in \\boxed{{}}."
)
_PUBLISHED_HEAD = _PUBLISHED[: _PUBLISHED.index("{problem}")]


def split_steps(solution: str) -> list[str]:
    """A solution's steps: its non-empty paragraphs (blank-line separated), as FAPO splits them."""
    return [p.strip() for p in re.split(r"\n\s*\n", solution) if p.strip()]


def render(template: str, problem: str, answer: str, steps: list[str], solution: str | None = None) -> str:
    """The GenRM's user message for these fields. "published" shows `solution`, the response as
    the policy wrote it (its steps are not marked there), and needs it: steps joined back are
    not the text the published GenRM was trained on."""
    if template == "published":
        if solution is None:
            raise ValueError("the 'published' GenRM template shows the raw solution: pass solution=")
        return _PUBLISHED.format(problem=problem, ground_truth=answer, solution=solution)
    if template == "fapo":
        body = "\n".join(_STEP.format(i=i, text=s) for i, s in enumerate(steps))
        return _FAPO.format(problem=problem.strip(), answer=str(answer).strip(), steps=body)
    if template == "compact":
        def field(x) -> str:  # a '|' inside a field would shift the steps: it becomes '/'
            return str(x).replace("|", "/")
        return "|".join([field(problem) + field(answer), *map(field, steps)]) + "|"
    raise ValueError(f"unknown GenRM template {template!r}: expected one of {TEMPLATES}")


# The parsers below read text a client sent to the server, so they must stay linear in its length:
# the patterns they replace (a lazy `(.*?)` per section, a backreference per step) rescanned the
# rest of the text from every candidate start, and one 200 kB request held the server for
# seconds on end (benchmarks/RESULTS.md §5).
_SECTIONS = ("[Problem]\n", "\n\n[Reference answer]\n", "\n\n[Solution]\n")
_CHECK = "\n\nCheck the steps"
_OPEN = re.compile(r"<step_([0-9]++)>\n")  # possessive: a digit run is read once, never re-split
_CLOSE = re.compile(r"\n</step_([0-9]++)>")


def _fapo_fields(text: str) -> tuple[str, str, str] | None:
    """(problem, answer, solution block) of the fapo rendering: each section header's first
    occurrence after the previous one, and the last "Check the steps" after them (what the
    pattern `[Problem]\\n(.*?)...(.*)\\n\\nCheck the steps` matched)."""
    at = text.find(_SECTIONS[0])
    if at < 0:
        return None
    at += len(_SECTIONS[0])
    fields = []
    for header in _SECTIONS[1:]:
        found = text.find(header, at)
        if found < 0:
            return None
        fields.append(text[at:found])
        at = found + len(header)
    end = text.rfind(_CHECK, at)
    if end < 0:
        return None
    return fields[0], fields[1], text[at:end]


def _fapo_steps(block: str) -> list[str]:
    """The texts of `<step_N>\\n...\\n</step_N>` in order, each closed by the first matching
    closer after it, an opener without one skipped: one pass over the openers and one over the
    closers (indexed by N), so no opener rescans the block."""
    closers: dict[str, list[int]] = {}
    for m in _CLOSE.finditer(block):
        closers.setdefault(m.group(1), []).append(m.start())
    steps, done = [], 0
    for m in _OPEN.finditer(block):
        if m.start() < done:  # inside the step just read
            continue
        ends = closers.get(m.group(1), [])
        i = bisect.bisect_left(ends, m.end())
        if i < len(ends):
            steps.append(block[m.end():ends[i]])
            done = ends[i] + len("\n</step_") + len(m.group(1)) + len(">")
    return steps


def parse_request(text: str) -> tuple[str, str, list[str]] | None:
    """(problem, answer, steps) of a message written by `render` with "fapo" or "compact", or
    None. A "published" message is a RequestError (HTTP 400 from the server) saying so: it holds
    the raw solution with no step boundaries, so no judge that needs the steps (the rule judges)
    can read it, and splitting it some other way would name steps the message never numbered.
    No pattern rescans the text: the time grows with its length, not its square (the server
    reads what any client sent)."""
    if text.startswith(_PUBLISHED_HEAD):
        raise RequestError("messages: a 'published' GenRM request shows the raw solution without step "
                           "boundaries, which a rule judge cannot read: serve a model for it, or use the "
                           "'fapo' or 'compact' template with a rule judge", "messages")
    fapo = _fapo_fields(text)
    if fapo is not None:
        problem, answer, block = fapo
        return problem, answer, _fapo_steps(block)
    if text.count("|") >= 1 and "=" in text.split("|", 1)[0]:
        head, *steps = text.split("|")
        problem, _, answer = head.rpartition("=")
        return problem + "=", answer, steps[:-1] if steps and steps[-1] == "" else steps
    return None


def step_verdict(text: str, n_steps: int) -> int | None:
    """A GenRM answer read as a step index: the integer in its last \\boxed{}, when it is -1 or
    below `n_steps`; None for no box, a non-integer, or an index out of range. The rule of our
    templates, and of a GenRM's own training reward (verl recipe/fapo/reward_fn_genrm.py reads
    its index in range too)."""
    box = extract_boxed(text or "")
    if box is None:
        return None
    box = box.strip()
    if not re.fullmatch(r"-?\d{1,6}", box):
        return None
    k = int(box)
    return k if k == -1 or 0 <= k < n_steps else None


def _flag_verdict(text: str, n_steps: int) -> int | None:
    """A GenRM answer read as the published FAPO run reads it (verl recipe/fapo/
    reward_fn_reasoning.py: `int(remove_boxed(last_boxed_only_string(answer))) != -1` flags the
    response, and an exception flags nothing): the last \\boxed{}'s content through Python's
    own `int`, so " -1 " is -1, "+3", "03" and "-0" are integers, and so is any index, in range
    or not, negative or not; None for no box or content `int` refuses (a fraction, a word, a
    nested brace, more than 4300 digits). `n_steps` bounds nothing here. Where this differs
    from the reference: `extract_boxed` also reads \\fbox{} and skips escaped braces, as every
    answer in this project is read; a GenRM trained on \\boxed{} answers meets neither."""
    box = extract_boxed(text or "")
    if box is None or sum(c.isdigit() for c in box) > _INT_DIGITS:
        return None
    try:
        return int(box)
    except ValueError:
        return None


_INT_DIGITS = 4300
"""Python's default `int` digit limit, under which the reference ran: over it `int` refuses (no
verdict). Checked here rather than left to `sys.get_int_max_str_digits()`, which a process may
lift, and then a reply of megabytes of digits would cost a quadratic conversion."""


VERDICT_RULES: dict[str, Callable[[str, int], int | None]] = {
    "fapo": step_verdict, "compact": step_verdict, "published": _flag_verdict}
"""How each template's answer is read: the verdict rule goes with the prompt the GenRM was trained
on. A verdict other than None and -1 flags the response (`is_flawed`)."""


def parse_verdict(text: str, n_steps: int, template: str) -> int | None:
    """The verdict in a GenRM answer to a `template` request about `n_steps` steps: -1 (no
    error), another integer (flawed: a step index under our templates' rule), or None (no usable
    verdict: the caller applies no penalty)."""
    try:
        rule = VERDICT_RULES[template]
    except KeyError:
        raise ValueError(f"unknown GenRM template {template!r}: expected one of {TEMPLATES}") from None
    return rule(text, n_steps)


def is_flawed(verdict: int | None) -> bool:
    """Whether a parsed verdict flags its response: any integer but -1 (None: no verdict)."""
    return verdict is not None and verdict != -1


# ---------------------------------------------------------------- addresses


def normalize_address(address: str) -> str:
    """An OpenAI base URL: 'host:port' -> 'http://host:port/v1', 'http://host:port' -> '.../v1',
    '.../v1' kept (https allowed, a trailing '/' dropped); anything else is a ValueError."""
    shown = redact_url(address) if isinstance(address, str) else address  # messages never show a password
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"GenRM address {shown!r}: expected 'host:port' or 'http(s)://host:port[/v1]'")
    a = address.strip().rstrip("/")
    if "://" not in a:
        if not re.fullmatch(r"[A-Za-z0-9.\-]+:\d{1,5}|\[[0-9A-Fa-f:]+\]:\d{1,5}", a):
            raise ValueError(f"GenRM address {shown!r}: a bare address must be 'host:port'")
        a = "http://" + a
    try:
        u = urlsplit(a)
        u.port  # noqa: B018  (raises ValueError for a port out of range)
    except ValueError as e:
        raise ValueError(f"GenRM address {shown!r}: {e}") from None
    if u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment:
        raise ValueError(f"GenRM address {shown!r}: expected 'host:port' or 'http(s)://host:port[/v1]'")
    if u.path in ("", "/"):
        return f"{u.scheme}://{u.netloc}/v1"
    if not u.path.endswith("/v1"):
        raise ValueError(f"GenRM address {shown!r}: the path must be empty or end in /v1 (got {u.path!r})")
    return f"{u.scheme}://{u.netloc}{u.path}"


# ---------------------------------------------------------------- the chat completion types


class RequestError(Exception):
    """A request the server refuses; answered in the OpenAI error format."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str = "invalid_value", kind: str = "invalid_request_error", close: bool = False) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.kind = message, param, status, code, kind
        self.close = close  # the body was not (all) read: the connection cannot carry another request


@dataclass
class Sampling:
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None


@dataclass
class Completion:
    text: str
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int


class Backend(Protocol):
    default_name: str

    async def complete(self, messages: list[dict[str, str]], sampling: Sampling) -> Completion: ...

    def stats(self) -> dict[str, Any]: ...


def last_user_text(messages: list[dict[str, str]]) -> str:
    for m in reversed(messages):
        if m["role"] == "user":
            return m["content"]
    raise RequestError("messages: no message has role 'user'", "messages")
