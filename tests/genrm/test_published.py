"""The "published" GenRM template: the prompt of the published FAPO run (verl
recipe/fapo/reward_fn_reasoning.py, FAPO_GENRM_TEMPLATE, on which FAPO-GenRM-4B was trained),
filled with the raw response, and its verdict rule (any boxed integer but -1 flags), beside our
templates' rule (an index in range)."""

from __future__ import annotations

import random

import pytest

from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast.protocol import (VERDICT_RULES, RequestError, is_flawed, parse_request, parse_verdict, render,
                                    step_verdict)
from reasonrl_fast.tasks.addition import judge_addition

PROBLEM = "Let $f(x) = x^{2} + {c}$ with $c = 1$. What is $f(3)$?"
ANSWER = "10"
# The response as the policy wrote it: leading spaces, a trailing newline, braces, a \boxed{}
# of its own and paragraphs. None of it may be touched.
SOLUTION = "  We have $f(3) = 3^{2} + 1$.\n\nThat is $9 + 1 = 10$, so the answer is $\\boxed{10}$.\n"

# The published prompt for these three fields, written out by hand from the text of
# FAPO_GENRM_TEMPLATE (not through any code of this project, nor str.format).
EXPECTED = """The following is a math problem with its ground truth answer, along with an AI solution (split into steps):

[Math Problem]

Let $f(x) = x^{2} + {c}$ with $c = 1$. What is $f(3)$?

[Ground Truth]

10

[AI Solution]

  We have $f(3) = 3^{2} + 1$.

That is $9 + 1 = 10$, so the answer is $\\boxed{10}$.


Your task is to review and critique the solution step by step. Once you identify an error in a step, \
return the index of the step where the earliest error occurs. Otherwise, return the index of -1 (which \
typically denotes 'not found').

Please reason step by step, put your final answer (i.e., the index) in \\boxed{}."""


def test_published_render_is_the_published_prompt_with_the_raw_solution():
    steps = ["We have $f(3) = 3^{2} + 1$.", "That is $9 + 1 = 10$, so the answer is $\\boxed{10}$."]
    assert render("published", PROBLEM, ANSWER, steps, solution=SOLUTION) == EXPECTED
    # the steps play no part in it: the published GenRM splits the solution itself
    assert render("published", PROBLEM, ANSWER, ["x"], solution=SOLUTION) == EXPECTED


def test_published_render_needs_the_raw_solution():
    with pytest.raises(ValueError, match="raw solution"):
        render("published", PROBLEM, ANSWER, ["a", "b"])


def test_published_request_is_refused_by_name_where_steps_are_needed():
    """The published prompt marks no steps: parsing it back (the rule judge) is a 400 naming the
    template, never a guessed split."""
    text = render("published", "47+85=", "132", [], solution="7+5=12,4+8+1=13 \\boxed{132}")
    with pytest.raises(RequestError, match="'published' GenRM request .* without step boundaries") as e:
        parse_request(text)
    assert e.value.status == 400 and e.value.param == "messages"
    with pytest.raises(RequestError, match="published"):
        judge_addition(text)  # the rule judge the server runs
    # our renderings still read back, also when a solution quotes the published header
    head = EXPECTED.split("[Math Problem]")[0]
    steps = [head + "7+5=12", "4+8+1=13"]
    assert parse_request(render("fapo", "47+85=", "132", steps)) == ("47+85=", "132", steps)


def test_published_template_with_the_rule_judge_is_a_config_error():
    with pytest.raises(ConfigError, match="template=published .* rule judge"):
        load_config(None, ["algo=fapo", "fapo.genrm.template=published"])
    cfg = load_config(None, ["algo=fapo", "fapo.genrm.template=published", "fapo.genrm.addresses=[127.0.0.1:9]"])
    assert cfg.fapo.genrm.template == "published" and cfg.fapo.genrm.top_p == 1.0
    for bad in ("0", "1.5"):
        with pytest.raises(ConfigError, match="top_p"):
            load_config(None, ["algo=fapo", f"fapo.genrm.top_p={bad}"])


# (answer, n_steps, published verdict, our templates' verdict). The published rule is Python's
# int() on the last box's content, != -1 flagging; ours a plain integer that is -1 or below n.
HOSTILE = [
    ("all fine \\boxed{-1}", 3, -1, -1),
    ("\\boxed{-1 }", 3, -1, -1),
    ("\\boxed{ -1\n}", 3, -1, -1),
    ("\\boxed{2}", 3, 2, 2),
    ("\\boxed{+3}", 5, 3, None),               # a sign ours does not take
    ("\\boxed{03}", 5, 3, 3),
    ("\\boxed{-0}", 3, 0, 0),                   # -0 is 0: a step, flawed
    ("\\boxed{7}", 3, 7, None),                 # out of range: flagged by the published rule only
    ("\\boxed{3}", 3, 3, None),                 # one past the last step
    ("\\boxed{-5}", 3, -5, None),               # negative but not -1: flagged there
    ("\\boxed{" + "9" * 40 + "}", 3, int("9" * 40), None),
    ("\\boxed{" + "9" * 4300 + "}", 3, int("9" * 4300), None),
    ("\\boxed{" + "9" * 4301 + "}", 3, None, None),  # past Python's int digit limit: int() refuses
    ("\\boxed{1_0}", 20, 10, None),             # int() reads underscores between digits
    ("first \\boxed{2} then \\boxed{-1}", 3, -1, -1),  # the last box counts
    ("first \\boxed{-1} then \\boxed{2}", 3, 2, 2),
    ("\\boxed{{-1}}", 3, None, None),           # nested braces: the content is "{-1}"
    ("\\boxed{\\text{-1}}", 3, None, None),
    ("\\boxed{1{2}}", 3, None, None),
    ("\\boxed{1.5}", 3, None, None),
    ("\\boxed{one}", 3, None, None),
    ("\\boxed{}", 3, None, None),
    ("\\boxed{-1", 3, None, None),              # unclosed
    ("the answer is -1", 3, None, None),        # no box
    ("", 3, None, None),
]


@pytest.mark.parametrize("text,n,published,ours", HOSTILE)
def test_each_template_reads_its_own_verdict_rule(text, n, published, ours):
    assert parse_verdict(text, n, "published") == published
    assert is_flawed(parse_verdict(text, n, "published")) == (published is not None and published != -1)
    for template in ("fapo", "compact"):
        assert parse_verdict(text, n, template) == ours
    assert step_verdict(text, n) == ours  # a GenRM's training reward reads an index in range


def test_the_rule_table_covers_every_template_and_nothing_else():
    from reasonrl_fast.protocol import TEMPLATES

    assert set(VERDICT_RULES) == set(TEMPLATES)
    with pytest.raises(ValueError, match="unknown GenRM template"):
        parse_verdict("\\boxed{1}", 3, "long")


def _reference_flag(text: str) -> tuple[bool, bool]:
    """(flawed, raised) as the published run's reader decides, re-written from its description:
    the last "\\boxed{" with its braces counted to the matching "}", the content through int(),
    flawed when != -1, and an exception (no box, unclosed, not an integer) flags nothing."""
    at = text.rfind("\\boxed{")
    if at < 0:
        return False, True
    depth = 0
    for i in range(at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                try:
                    return int(text[at + len("\\boxed{"):i]) != -1, False
                except ValueError:
                    return False, True
    return False, True


def test_published_rule_agrees_with_the_reference_reader_on_random_answers():
    rng = random.Random(11)
    junk = ["\\boxed{", "{", "}", "-1", " ", "x", "\n", "step "]
    content = ["-", "+", "1", "0", "7", " ", "_", "{", "}", "x", ".", "-1"]

    def some(pieces: list[str], most: int) -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, most)))

    raised = flagged = 0
    for _ in range(5000):
        inside = some(content, 4) if rng.random() < 0.7 else rng.choice(["-1", " -1 ", "-01", "-1_0", "- 1", "-1\n"])
        text = some(junk, 4) + "\\boxed{" + inside + rng.choice(["}", "}", ""]) + some(junk, 3)
        v = parse_verdict(text, rng.randint(1, 5), "published")
        want_flawed, want_raised = _reference_flag(text)
        assert (is_flawed(v), v is None) == (want_flawed, want_raised), repr(text)
        raised += want_raised
        flagged += want_flawed
    assert 200 < flagged and 200 < 5000 - raised - flagged and 200 < raised  # every outcome is reached
