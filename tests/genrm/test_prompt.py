"""The GenRM's request renderings and verdict parsing."""

import random

import pytest

from reasonrl_fast.genrm.prompt import TEMPLATES, parse_request, parse_verdict, render, split_steps


@pytest.mark.parametrize("template", TEMPLATES)
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
def test_parse_verdict(text, n, want):
    assert parse_verdict(text, n) == want
