"""The prepare command on small files in each public release's layout, the shipped math set, and a
round trip through verl's own RLHFDataset and our trainer's reader."""

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from reasonrl_fast.data.prepare import BOXED_INSTRUCTION, main, prepare, smoke_path
from reasonrl_fast.data.records import DataError, load_records, render_prompt
from reasonrl_fast.rewards.math import math_equal
from tests.helpers.chat_tokenizer import templated_tokenizer


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


DAPO_PROMPT = ("Solve the following math problem step by step. The last line of your response should be of the "
               "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nWhat is 2+3?"
               "\n\nRemember to put your answer on its own line after \"Answer:\".")
LAYOUTS = {
    # name -> (rows in the release's layout, data_source, first ground truth, first prompt's end)
    "dapo-math-17k": ([{"data_source": "math_dapo", "prompt": [{"role": "user", "content": DAPO_PROMPT}],
                        "ability": "MATH", "reward_model": {"style": "rule-lighteval/MATH_v2", "ground_truth": "5"},
                        "extra_info": {"index": "a1b2"}}] * 3, "math_dapo", "5", '"Answer:".'),
    "math500": ([{"problem": "Compute $1/2+1/4$.", "solution": "... \\boxed{\\frac34}", "answer": "\\frac{3}{4}",
                  "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"}],
                "HuggingFaceH4/MATH-500", "\\frac{3}{4}", BOXED_INSTRUCTION),
    "aime24": ([{"ID": "2024-I-1", "Problem": "Find $x$.", "Solution": "so 204.", "Answer": 204}],
               "aime24", "204", BOXED_INSTRUCTION),
    "aime25": ([{"id": 0, "problem": "Find $y$.", "solution": "Thus $\\boxed{70}$."}], "aime25", "70",
               BOXED_INSTRUCTION),
    "gsm8k": ([{"question": "Tom has 1,200 apples and buys 34. How many?", "answer": "1200+34=1234\n#### 1,234"},
               {"question": "No final answer here.", "answer": "42"}], "gsm8k", "1234", BOXED_INSTRUCTION),
    # FlowRL's other three: AMC's answers as floats (AI-MO's release), Minerva's only in the
    # solution's box (the Qwen2.5-Math evaluation files), OlympiadBench's as a list in $...$
    "amc23": ([{"id": 3, "problem": "What is $3^3$?", "answer": 27.0, "url": "https://example.org/amc"}],
              "amc23", "27", BOXED_INSTRUCTION),
    "minerva": ([{"problem": "Find the wavelength in m.", "solution": "Thus $\\boxed{2.75 \\times 10^{-6}}$.",
                  "type": "Physics", "idx": 0}], "minerva_math", "2.75 \\times 10^{-6}", BOXED_INSTRUCTION),
    "olympiadbench": ([{"id": 2231, "question": "Find $x$ with $2x = 1$.", "final_answer": ["$\\frac{1}{2}$"],
                        "is_multiple_answer": False, "subfield": "Algebra"},
                       {"id": 2232, "question": "Prove that it holds.", "final_answer": None}],
                      "olympiadbench", "\\frac{1}{2}", BOXED_INSTRUCTION),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_prepare_public_layouts(tmp_path, name):
    rows, source, truth, end = LAYOUTS[name]
    out = tmp_path / "out.jsonl"
    counts = prepare(name, write_jsonl(tmp_path / "in.jsonl", rows), str(out))
    assert counts["read"] == len(rows) and counts["written"] == 1
    rec = load_records(str(out))[0]
    assert (rec["data_source"], rec["answer"], rec["extra_info"]["index"]) == (source, truth, 0)
    assert rec["prompt"][0]["role"] == "user" and rec["prompt"][0]["content"].endswith(end)
    written = json.loads(out.read_text().splitlines()[0])
    assert set(written) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert written["reward_model"] == {"style": "rule", "ground_truth": truth}
    if name == "dapo-math-17k":  # its prompt is kept as is; the repeated rows are dropped
        assert rec["prompt"][0]["content"] == DAPO_PROMPT and counts["dropped"] == {"duplicate": 2}
    if name == "gsm8k":
        assert counts["dropped"] == {"answer without ####": 1}
    if name == "olympiadbench":  # a proof has no final answer to score
        assert counts["dropped"] == {"no answer": 1}


def test_an_answer_in_parts_needs_every_part(tmp_path):
    """OlympiadBench's final_answer with several parts is one ground truth holding them all: the
    math scorer takes them in any order, and one part alone is wrong."""
    from reasonrl_fast.rewards.score import default_compute_score

    out = tmp_path / "o.jsonl"
    prepare("olympiadbench", write_jsonl(tmp_path / "in.jsonl", [{"question": "Find all roots of $(x-1)(x-2)$.",
                                                                  "final_answer": ["$1$", "$2$"]}]), str(out))
    truth = load_records(str(out))[0]["answer"]
    assert truth == "1, 2"
    assert default_compute_score("olympiadbench", "\\boxed{2, 1}", truth)["acc"]
    for hostile in ("\\boxed{1}", "\\boxed{2}", "\\boxed{1, 2, 3}", "\\boxed{}", "1, 2"):
        assert not default_compute_score("olympiadbench", hostile, truth)["acc"], hostile


def test_prepare_generic_jsonl_instruction_split_limit(tmp_path):
    rows = [{"q": f"{i}+1=", "a": i + 1} for i in range(5)]
    out = tmp_path / "o.jsonl"
    counts = prepare("jsonl", write_jsonl(tmp_path / "in.jsonl", rows), str(out), instruction="Box it.",
                     split="test", limit=2, prompt_key="q", answer_key="a", data_source="mine")
    assert counts == {"read": 5, "written": 2, "dropped": {"over --limit": 3}}
    recs = load_records(str(out))
    assert [r["prompt"][0]["content"] for r in recs] == ["0+1=\n\nBox it.", "1+1=\n\nBox it."]
    assert {(r["data_source"], r["extra_info"]["split"]) for r in recs} == {("mine", "test")}


def test_prepare_humaneval_from_the_package(tmp_path):
    out = tmp_path / "he.jsonl"
    assert prepare("humaneval", None, str(out))["written"] == 164
    recs = load_records(str(out))
    assert {(r["data_source"], r["ability"]) for r in recs} == {("humaneval", "code")}
    truth = json.loads(recs[0]["answer"])
    assert truth["entry_point"] == "has_close_elements" and "def check(" in truth["test"]
    # The problem's own code rides along: the scorer runs it before the program and the tests.
    assert truth["prompt"].startswith("from typing import List\n")
    assert "def has_close_elements(" in truth["prompt"]
    assert "def has_close_elements(" in recs[0]["prompt"][0]["content"]


def test_wrong_layout_lists_the_columns(tmp_path, capsys):
    f = write_jsonl(tmp_path / "x.jsonl", [{"text": "hi", "label": 1}])
    with pytest.raises(ValueError, match=r"x\.jsonl: does not look like math500.*missing problem, answer/solution; "
                                         r"the file has \['label', 'text'\]"):
        prepare("math500", f, str(tmp_path / "o.jsonl"))
    with pytest.raises(SystemExit):  # the command says it in one line, without a traceback
        main(["gsm8k", "--input", f, "--output", str(tmp_path / "o.jsonl")])
    assert "error: " in capsys.readouterr().err
    with pytest.raises(ValueError, match="--input is required"):
        prepare("aime24", None, str(tmp_path / "o.jsonl"))


# Each shipped answer, and an equivalent form of it the math scorer must accept: integers,
# fractions, radicals, intervals, sets and expressions.
SMOKE_EQUIVALENTS = [
    "391", "210.0", "24", "2", "56", "42", "36", "x = 9", "20", "720^\\circ", "-32", "64", "31", "120",
    "0.5", "1/3", "0.25", "0.75", "\\frac{6}{10}", "\\dfrac{1}{2}", "1.5", "3.0", "0.625",
    "2^{1/2}", "\\sqrt{50}", "\\sqrt{20}", "\\frac{2\\sqrt{3}}{2}", "\\sqrt{12}", "\\frac{1}{\\sqrt{2}}",
    "(4,\\infty)", "[-1,3]", "[3,\\infty)", "(-3,3)", "[1, \\infty)",
    "\\{3, 2\\}", "\\{1, -1, 0\\}", "\\{4, 3\\}", "\\{4, -4\\}",
    "1 + 2x + x^2", "(x+3)(x-3)", "3 x^{2}", "6 + x", "\\pi \\cdot 9", "5 \\pi", "(x+1)^2", "x/2 - 2"]


def test_smoke_set_answers_and_prepare(tmp_path):
    shipped = [json.loads(line) for line in Path(smoke_path()).read_text().splitlines()]
    assert len(shipped) >= 40 and len(shipped) == len(SMOKE_EQUIVALENTS)
    for row, other in zip(shipped, SMOKE_EQUIVALENTS):
        assert math_equal(other, row["answer"]), (row["id"], row["answer"], other)
        assert not math_equal("17", row["answer"]), row["id"]  # and it can say no
    out = tmp_path / "smoke.jsonl"
    assert prepare("smoke", None, str(out))["written"] == len(shipped)
    assert [r["answer"] for r in load_records(str(out))] == [r["answer"] for r in shipped]


def test_round_trip_through_verl_and_our_trainer(tmp_path, verl_python):
    """prepare writes parquet; verl 0.9.1's RLHFDataset (its own venv) and our `load_datasets`
    read the same prompts, rendered with the same chat template, and the same ground truths."""
    from reasonrl_fast.runtime.datasets import load_datasets
    from tests.helpers.verl_env import verl_dataset_rows

    start = time.monotonic()
    prepare("smoke", None, str(tmp_path / "s.parquet"), limit=4)
    prepare("humaneval", None, str(tmp_path / "h.parquet"), limit=2)
    tok = templated_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    theirs = []
    for part in ("s", "h"):
        theirs += verl_dataset_rows(verl_python, str(tmp_path / f"{part}.parquet"), str(tmp_path / "tok"), max_prompt_length=4096)
    cfg = SimpleNamespace(data=SimpleNamespace(train_files=[str(tmp_path / "s.parquet"), str(tmp_path / "h.parquet")],
                                               val_files=[], val_sets=[], train_sources=[], val_sources=[],
                                               task="addition",
                                               max_prompt_length=4096),
                          trainer=SimpleNamespace(seed=1))
    ours, _ = load_datasets(cfg, tok)
    assert len(theirs) == len(ours) == 6
    for t, o in zip(theirs, ours):
        assert t["prompt"] == o["prompt"] == render_prompt(o["messages"], tok)
        assert t["raw_prompt"] == o["messages"]
        assert (t["ground_truth"], t["data_source"], t["ability"]) == (o["answer"], o["data_source"], o["ability"])
        assert t["extra_info"]["index"] == o["extra_info"]["index"]
    print(f"round trip: {time.monotonic() - start:.1f} s")


# --- dapo-math-17k --boxed: the published FAPO data ---------------------------------------------

def published_prompt(question: str) -> str:
    # verl recipe/fapo/prepare_fapo_data.py, written out: the problem, a blank line, the instruction
    return question.strip() + "\n\n" + "Please reason step by step, and put your final answer within \\boxed{}."


def _verl_row(content, truth="5"):
    return {"data_source": "math_dapo", "prompt": [{"role": "user", "content": content}], "ability": "MATH",
            "reward_model": {"style": "rule-lighteval/MATH_v2", "ground_truth": truth}, "extra_info": {"index": "x"}}


def test_boxed_replaces_dapos_instruction(tmp_path):
    from reasonrl_fast.rewards.score import default_compute_score, scorer_for

    rows = [_verl_row(DAPO_PROMPT)] * 3 + [_verl_row("What is 1+1? Answer: on its own line.", "2")]
    out = tmp_path / "boxed.jsonl"
    counts = prepare("dapo-math-17k", write_jsonl(tmp_path / "in.jsonl", rows), str(out), boxed=True)
    assert counts == {"read": 4, "written": 1,
                      "dropped": {"duplicate": 2, "no DAPO instruction to replace": 1}}
    rec = load_records(str(out))[0]
    assert rec["prompt"] == [{"role": "user", "content": published_prompt("What is 2+3?")}]
    assert "Answer:" not in rec["prompt"][0]["content"]
    assert (rec["data_source"], rec["answer"], rec["extra_info"]["question"]) == ("math_dapo_boxed", "5",
                                                                                  "What is 2+3?")
    assert scorer_for(rec["data_source"]) == "boxed"
    score = lambda text: default_compute_score(rec["data_source"], text, rec["answer"], rec["extra_info"])
    assert score("2+3 = 5, so \\boxed{5}") == {"score": 1.0, "acc": True}
    assert score("Answer: 5") == {"score": -1.0, "acc": False}  # the box is what was asked for


def test_boxed_flat_rows_and_the_cli(tmp_path, capsys):
    # open-r1/DAPO-Math-17k-Processed's layout (the published data's source): the bare problem
    rows = [{"prompt": "  What is 2+3?\n", "solution": "5", "data_source": "math_dapo"},
            {"prompt": DAPO_PROMPT.replace("2+3", "4+4"), "solution": "8"}]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    counts = main(["dapo-math-17k", "--input", src, "--output", str(tmp_path / "b.jsonl"), "--boxed"])
    assert counts["written"] == 2 and "wrote 2" in capsys.readouterr().out
    recs = load_records(str(tmp_path / "b.jsonl"))
    assert [r["prompt"][0]["content"] for r in recs] == [published_prompt("What is 2+3?"),
                                                          published_prompt("What is 4+4?")]
    assert [r["extra_info"]["question"] for r in recs] == ["What is 2+3?", "What is 4+4?"]
    assert {r["data_source"] for r in recs} == {"math_dapo_boxed"}
    # --instruction still sets the text; without --boxed a flat bare problem gets it appended and a
    # problem still wrapped in DAPO's instruction is kept as it is
    prepare("dapo-math-17k", src, str(tmp_path / "i.jsonl"), instruction="Box it.", boxed=True)
    assert load_records(str(tmp_path / "i.jsonl"))[0]["prompt"][0]["content"] == "What is 2+3?\n\nBox it."
    prepare("dapo-math-17k", src, str(tmp_path / "plain.jsonl"))
    plain = load_records(str(tmp_path / "plain.jsonl"))
    assert [r["prompt"][0]["content"] for r in plain] == ["  What is 2+3?\n\n" + BOXED_INSTRUCTION,
                                                           DAPO_PROMPT.replace("2+3", "4+4")]
    assert {r["data_source"] for r in plain} == {"math_dapo"}


def test_boxed_is_for_dapo_math_only(tmp_path):
    f = write_jsonl(tmp_path / "x.jsonl", [{"problem": "Find $x$.", "answer": "1"}])
    with pytest.raises(ValueError, match="--boxed applies to dapo-math-17k only"):
        prepare("aime24", f, str(tmp_path / "o.jsonl"), boxed=True)


# --- aime24/aime25 --dapo-prompt: validation in a DAPO-trained recipe's prompt format --------------

@pytest.mark.parametrize("name", ["aime24", "aime25"])
def test_dapo_prompt_writes_the_training_prompts_format_and_its_scorer_reads_the_answer_line(tmp_path, name):
    """The problem wrapped exactly as a DAPO-Math-17k training prompt (the one dapo_problem unwraps),
    the data_source kept, so its scorer (the DAPO rule) reads the "Answer:" line that prompt asks for;
    a wrong answer line, and a right number elsewhere under a wrong line, score -1."""
    from reasonrl_fast.data.prepare import dapo_problem
    from reasonrl_fast.rewards.score import default_compute_score

    rows = [{"problem": "What is 2+3?", "answer": "5"}]
    out = tmp_path / "d.jsonl"
    main([name, "--input", write_jsonl(tmp_path / "in.jsonl", rows), "--output", str(out), "--dapo-prompt"])
    rec = load_records(str(out))[0]
    assert rec["prompt"] == [{"role": "user", "content": DAPO_PROMPT}]
    assert dapo_problem(rec["prompt"][0]["content"]) == "What is 2+3?"
    assert rec["data_source"] == name and rec["answer"] == "5"
    score = lambda text: default_compute_score(name, text, rec["answer"], rec["extra_info"])["acc"]
    assert score("2 + 3 makes five.\nAnswer: 5") and not score("Answer: 6")
    assert not score("5 is tempting.\nAnswer: 6")


def test_dapo_prompt_is_for_the_aime_sets_and_excludes_an_instruction(tmp_path):
    f = write_jsonl(tmp_path / "x.jsonl", [{"problem": "Find $x$.", "answer": "1"}])
    for name in ("math500", "dapo-math-17k", "gsm8k"):
        with pytest.raises(ValueError, match=f"--dapo-prompt applies to aime24, aime25 .*not to {name}$"):
            prepare(name, f, str(tmp_path / "o.jsonl"), dapo_prompt=True)
    with pytest.raises(ValueError, match="--dapo-prompt and --instruction both set"):
        prepare("aime24", f, str(tmp_path / "o.jsonl"), instruction="Box it.", dapo_prompt=True)
    assert not (tmp_path / "o.jsonl").exists()


def test_the_output_is_never_the_input_and_a_failed_write_keeps_the_old_output(tmp_path, monkeypatch, capsys):
    """An --output naming the --input file (by its path, a relative one, a link) is refused
    before anything is read, so the source is never rewritten; and the output is written beside
    its name and moved there once complete, so a write that fails leaves the file it would have
    replaced as it was."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    before = Path(src).read_bytes()
    os.symlink(src, tmp_path / "link.jsonl")
    monkeypatch.chdir(tmp_path)
    for out in (src, "in.jsonl", "./sub/../in.jsonl", str(tmp_path / "link.jsonl")):
        with pytest.raises(SystemExit) as e:
            main(["jsonl", "--input", src, "--output", out])
        assert e.value.code == 2 and "is the --input file" in capsys.readouterr().err
        assert Path(src).read_bytes() == before
    with pytest.raises(SystemExit):  # the input named through the link: the same file
        main(["jsonl", "--input", str(tmp_path / "link.jsonl"), "--output", src])
    assert Path(src).read_bytes() == before

    import pyarrow.parquet as pq

    out = tmp_path / "out.parquet"
    prepare("jsonl", src, str(out))
    good = out.read_bytes()

    def cut_short(table, where):
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", cut_short)
    with pytest.raises(DataError, match=r"--output .*out.parquet: cannot be written \(No space left on device\)"):
        prepare("jsonl", src, str(out))
    assert out.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "link.jsonl", "out.parquet"]  # no temporary left


# --- gpqa-diamond: the published FAPO validation set's multiple-choice benchmark ------------------

GPQA = Path(__file__).parent / "fixtures" / "gpqa_diamond_sample.csv"
"""Three made-up questions in the release's CSV layout (its 16 columns; a question over three lines
with quotes and commas, a choice with a comma, one with spaces around it)."""


def _gpqa_choices(content: str) -> list[str]:
    lines = content.split("\n")
    return [line[3:] for line in lines if line[:3] in ("A. ", "B. ", "C. ", "D. ")]


def test_gpqa_diamond_is_written_as_the_published_fapo_set(tmp_path):
    from reasonrl_fast.data.prepare import GPQA_INSTRUCTION
    from reasonrl_fast.rewards.score import default_compute_score, scorer_for

    out = tmp_path / "gpqa.jsonl"
    assert prepare("gpqa-diamond", str(GPQA), str(out)) == {"read": 3, "written": 3, "dropped": {}}
    recs = load_records(str(out))
    assert {(r["data_source"], r["ability"], r["extra_info"]["split"]) for r in recs} == {("gpqa-diamond", "general", "test")}
    assert scorer_for("gpqa-diamond") == "boxed"
    rows = [("A ball is dropped from rest. Ignoring air, how far does it fall in the first 2 s (g = 10 m/s^2)?",
             "20 m", {"10 m", "40 m", "5 m"}),
            ("Which compound has the formula \"NaCl\"?\nChoose the common name,\nnot the systematic one.",
             "table salt", {"baking soda", "lye, caustic soda", "chalk"}),
            ("How many chromosomes does a typical human somatic cell have?", "46", {"23", "44", "48"})]
    for rec, (question, right, wrong) in zip(recs, rows):
        content = rec["prompt"][0]["content"]
        choices = _gpqa_choices(content)
        letter = rec["answer"]
        assert letter in "ABCD" and len(letter) == 1 and choices["ABCD".index(letter)] == right
        assert set(choices) - {right} == wrong  # stripped, each once
        # the published template, character for character
        assert content == (question + "\n" + "".join(f"{x}. {c}\n" for x, c in zip("ABCD", choices)) + "\n"
                           + GPQA_INSTRUCTION)
        assert GPQA_INSTRUCTION.endswith("(only the choice letter) within \\boxed{}.")
        assert rec["extra_info"]["question"] == question
        # scored as the published run scores it: the last box, normalised, against the letter
        wrong_letter = next(x for x in "ABCD" if x != letter)
        assert default_compute_score("gpqa-diamond", f"So it is {right}.\n\\boxed{{{letter}}}", letter)["acc"]
        assert default_compute_score("gpqa-diamond", f"\\boxed{{\\text{{{letter}}}}}", letter)["acc"]
        assert not default_compute_score("gpqa-diamond", f"\\boxed{{{wrong_letter}}}", letter)["acc"]
    # the same file at every conversion: the order is drawn from the question, not the clock
    again = tmp_path / "again.jsonl"
    prepare("gpqa-diamond", str(GPQA), str(again))
    assert again.read_text() == out.read_text()


def test_gpqa_choice_order_is_uniform_over_the_letters(tmp_path):
    """The right answer's place is drawn uniformly (the published randint(0, 3)), so that always
    answering one letter scores about a quarter: 4000 questions, each letter 1000 +- 137 (5 sigma;
    the draw is the questions', so the counts are the same at every run)."""
    rows = [{"Question": f"Question number {i}?", "Correct Answer": "right", "Incorrect Answer 1": "w1",
             "Incorrect Answer 2": "w2", "Incorrect Answer 3": "w3"} for i in range(4000)]
    out = tmp_path / "g.jsonl"
    prepare("gpqa-diamond", write_jsonl(tmp_path / "in.jsonl", rows), str(out))
    recs = load_records(str(out))
    counts = {x: sum(r["answer"] == x for r in recs) for x in "ABCD"}
    assert all(abs(c - 1000) <= 137 for c in counts.values()), counts
    # the wrong answers are shuffled too: each wrong one is first among them in some questions
    firsts = {[c for c in _gpqa_choices(r["prompt"][0]["content"]) if c != "right"][0] for r in recs}
    assert firsts == {"w1", "w2", "w3"}


@pytest.mark.parametrize("answer", [
    "\\boxed{ABCD}", "\\boxed{A, B, C, D}", "\\boxed{A or C}", "\\boxed{}", "\\boxed{C and also A}",
    "\\boxed{table salt}", "The answer is C.", "Answer: C", "\\boxed{C}" + " and more text" * 30 + " \\boxed{B}",
    "\\boxed{\\text{A}\\text{C}}", "\\boxed{С}",  # a Cyrillic С
    "\\boxed{C", "C" * 5000, "\\boxed{(C)}",  # unclosed; a flood; the published verifier reads "(C)" as is
])
def test_gpqa_hostile_answers_do_not_score(answer):
    """What a policy might try on a letter question whose answer is C: every letter at once, a
    list, an empty box, the choice's text, no box, a right box buried before a wrong one, a
    look-alike letter, an unclosed box, a flood."""
    from reasonrl_fast.rewards.score import default_compute_score

    r = default_compute_score("gpqa-diamond", answer, "C")
    assert r["acc"] is False and r["score"] == -1.0, (answer, r)


@pytest.mark.parametrize("content, error", [
    (b'Question,Correct Answer\n"unclosed quote,1\n', r"bad.csv: not a valid CSV file \(line \d+: "),
    (b"Question,Correct Answer\nq,a,surplus\n", r"bad.csv: record 1 has more fields than the header names \(2\)"),
    ("Question\ncaf\xe9\n".encode("latin-1"), r"bad.csv: not a UTF-8 text file"),
    (b"Question,Answer\nq,a\n", r"does not look like gpqa-diamond: it needs the columns"),
], ids=["unclosed-quote", "surplus-field", "latin-1", "other-columns"])
def test_a_csv_that_is_not_one_is_named(tmp_path, content, error):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(content)
    with pytest.raises(DataError, match=error):
        prepare("gpqa-diamond", str(bad), str(tmp_path / "o.jsonl"))
