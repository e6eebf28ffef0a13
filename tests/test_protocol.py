"""The GenRM's request renderings and verdict parsing, and the request parsers' hostile inputs."""

import random
import re
import time

import pytest

from reasonrl_fast.tasks.addition import MAX_OPERAND_DIGITS, parse_problem
from reasonrl_fast.protocol import parse_request, parse_verdict, render, split_steps


@pytest.mark.parametrize("template", ["fapo", "compact"])
def test_render_parse_round_trip(template):
    rng = random.Random(1)
    for _ in range(100):
        a, b = rng.randint(1, 999), rng.randint(1, 999)
        steps = [f"{rng.randint(0, 9)}+{rng.randint(0, 9)}={rng.randint(0, 19)}" for _ in range(rng.randint(1, 4))]
        text = render(template, f"{a}+{b}=", str(a + b), steps)
        assert parse_request(text) == (f"{a}+{b}=", str(a + b), steps)


def test_fapo_template_holds_multiline_steps():
    steps = ["Let $x = 2$.\nThen $x^2 = 4$.", "So the answer is $\\boxed{4}$."]
    text = render("fapo", "What is $2^2$?\nExplain.", "4", steps)
    assert "<step_1>" in text and "\\boxed{}" in text
    assert parse_request(text) == ("What is $2^2$?\nExplain.", "4", steps)


def test_compact_fields_cannot_shift_the_steps():
    text = render("compact", "47+85=", "132", ["7|5=12", "", "x"])
    assert parse_request(text) == ("47+85=", "132", ["7/5=12", "", "x"])


def test_unknown_template_and_unreadable_request():
    with pytest.raises(ValueError, match="unknown GenRM template"):
        render("long", "1+1=", "2", ["1+1=2"])
    assert parse_request("no request here") is None


def test_split_steps_by_paragraph():
    assert split_steps("a\n\nb\n  \n\nc\n") == ["a", "b", "c"]
    assert split_steps("one\nline") == ["one\nline"]
    assert split_steps("") == []


@pytest.mark.parametrize("template", ["fapo", "compact"])
@pytest.mark.parametrize("text,n,want", [
    ("the step 1 is wrong \\boxed{1}", 3, 1),
    ("all right \\boxed{-1}", 3, -1),
    ("\\boxed{ 0 }", 1, 0),
    ("\\boxed{3}", 3, None),  # out of range
    ("\\boxed{-2}", 3, None),
    ("\\boxed{one}", 3, None),
    ("\\boxed{1.5}", 3, None),
    ("no box", 3, None),
    ("", 3, None),
    ("first \\boxed{0} then \\boxed{2}", 3, 2),  # the last box counts
])
def test_parse_verdict(text, n, want, template):
    assert parse_verdict(text, n, template) == want


# ---------------------------------------------------------------- hostile requests
# The server parses what any client sends. The patterns these parsers replaced (kept below as the
# reference of what they must match) rescanned the text from every candidate start: 40,000 digits
# then '=|x|' took 10 s, '[Problem]\n' x 20,000 took 24 s, on the event loop.

_OLD_FAPO = re.compile(r"\[Problem\]\n(.*?)\n\n\[Reference answer\]\n(.*?)\n\n\[Solution\]\n(.*)\n\nCheck the steps",
                       re.S)
_OLD_STEP = re.compile(r"<step_(\d+)>\n(.*?)\n</step_\1>", re.S)
_OLD_PROBLEM = re.compile(r"(\d+)\+(\d+)=")


def _old_parse_request(text: str):
    m = _OLD_FAPO.search(text)
    if m:
        return m.group(1), m.group(2), [s for _, s in _OLD_STEP.findall(m.group(3))]
    if text.count("|") >= 1 and "=" in text.split("|", 1)[0]:
        head, *steps = text.split("|")
        problem, _, answer = head.rpartition("=")
        return problem + "=", answer, steps[:-1] if steps and steps[-1] == "" else steps
    return None


_PIECES = ["[Problem]\n", "\n\n[Reference answer]\n", "\n\n[Solution]\n", "\n\nCheck the steps", "<step_0>\n",
           "<step_1>\n", "<step_01>\n", "\n</step_0>", "\n</step_1>", "\n</step_01>", "\n</step_10>", "x", "\n",
           "1", "+", "=", "|", "<step_", ">"]


def test_linear_parsers_match_the_patterns_they_replace():
    rng = random.Random(7)
    frame = render("fapo", "12+34=", "46", ["a", "b"])
    for steps in ["<step_0>\n<step_1>\na\n</step_1>\n</step_0>\n<step_1>\nb\n</step_1>",  # a step inside a step
                  "<step_0>\n<step_0>\na\n</step_0>\n</step_0>", "<step_1>\n</step_1>\n</step_1>",
                  "<step_01>\nx\n</step_1>\n</step_01>", "<step_0>\n\n</step_0>"]:
        text = frame.replace("<step_0>\na\n</step_0>", steps)
        assert parse_request(text) == _old_parse_request(text), repr(text)
    fapo = 0
    for _ in range(3000):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 30)))
        if rng.random() < 0.5:  # inside a well-formed frame, where the step pieces matter
            cut = rng.randrange(len(frame))
            text = frame[:cut] + text + frame[cut:]
        assert parse_request(text) == _old_parse_request(text), repr(text)
        fapo += _OLD_FAPO.search(text) is not None
        m = _OLD_PROBLEM.search(text)
        assert parse_problem(text) == ((int(m.group(1)), int(m.group(2))) if m else None), repr(text)
    assert fapo > 300  # the sample reaches the fapo reading, not only the compact one


HOSTILE = {
    "digits": lambda: "4" * 400_000 + "=|x|",
    "digits, +, digits": lambda: "4" * 200_000 + "+" + "5" * 200_000 + "x=|x|",
    "problem headers": lambda: "[Problem]\n" * 200_000,
    "reference headers": lambda: "[Problem]\n" + "\n\n[Reference answer]\n" * 100_000,
    "unclosed steps": lambda: render("fapo", "1+2=", "3", []).replace(
        "[Solution]\n", "[Solution]\n" + "<step_0>\n" * 200_000),
    "distinct unclosed steps": lambda: render("fapo", "1+2=", "3", []).replace(
        "[Solution]\n", "[Solution]\n" + "".join(f"<step_{i}>\n" for i in range(200_000))),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_requests_parse_in_linear_time(name):
    """Ten times the sizes that took the old patterns 10-24 s: well under a second now."""
    text = HOSTILE[name]()
    t = time.perf_counter()
    req = parse_request(text)
    if req is not None:
        try:
            parse_problem(req[0])
        except ValueError:  # operands over the digit cap
            pass
    assert time.perf_counter() - t < 1.0, (name, time.perf_counter() - t)


def test_operand_digit_cap():
    n = MAX_OPERAND_DIGITS
    assert parse_problem("9" * n + "+1=") == (int("9" * n), 1)
    with pytest.raises(ValueError, match=f"{n + 1} digits"):
        parse_problem("1+" + "9" * (n + 1) + "=")


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "47+85=132|7+6=12|4+8+1=13|"}],
    [{"role": "system", "content": "judge"}, {"role": "user", "content": "a b\n\n{{ x }} {% raw %}"}],
    [{"role": "user", "content": "first"}, {"role": "assistant", "content": "reply"},
     {"role": "user", "content": "second"}, {"role": "assistant", "content": "after"}],
])
def test_last_user_chat_template_renders_what_our_server_feeds_the_model(messages):
    """The template `vllm serve --chat-template` takes renders, for a tokenizer without one, the text
    our hf backend tokenizes (`last_user_text`): no role markers, no generation prompt, the
    content verbatim (template syntax inside it stays text)."""
    from reasonrl_fast.models.tiny import char_tokenizer
    from reasonrl_fast.protocol import LAST_USER_CHAT_TEMPLATE, last_user_text

    tok = char_tokenizer()
    assert not getattr(tok, "chat_template", None)
    text = tok.apply_chat_template(messages, chat_template=LAST_USER_CHAT_TEMPLATE, tokenize=False,
                                   add_generation_prompt=True)
    assert text == last_user_text(messages)
