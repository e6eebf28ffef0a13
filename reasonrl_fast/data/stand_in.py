"""Stand-in records: a few small records in the verl schema, of the kind a recipe's data file
holds, each with a reference response its scorer counts right. The CPU rehearsal
(reasonrl_fast/rehearse.py) trains on them in place of the recipe's files and warm-starts its
stand-in model on the reference responses.

One example per scorer kind (`EXAMPLES`, the keys of rewards/score.py `SCORERS`): a new scorer
kind gets its example here, next to the others (tests/test_rehearse.py checks the keys match).

The records carry the data_source of the file they stand in for, never guessed from its name:
the file's own records where it is on this machine (what the trainer would read), else the
config's `data.train_sources` / `data.val_sources` entry for it.
"""

from __future__ import annotations

import json
import os
from typing import Callable, NamedTuple

from reasonrl_fast.errors import ConfigError

SUMS = [(0, 1), (1, 0), (1, 1), (2, 0), (0, 2)]  # answers 1 or 2: a warm-started guess is often right


class Example(NamedTuple):
    content: str  # the user message
    ability: str
    ground_truth: str
    extra_info: dict
    response: str  # the reference response, scored right


def _answer(i: int, a: int, b: int) -> Example:
    """A math answer in \\boxed{} (the math, DAPO and box-only scorers all read it)."""
    return Example(f"{a}+{b}", "math", str(a + b), {}, f"\\boxed{{{a + b}}}")


def _program(i: int, a: int, b: int) -> Example:
    """A HumanEval-style function and its test."""
    fn = f"f{i}"
    test = f"def check(candidate):\n    assert candidate() == {a + b}\n"
    return Example(f"def {fn}():", "code", json.dumps({"test": test, "entry_point": fn}), {},
                   f"```python\ndef {fn}():\n    return {a + b}\n```")


def _verdict(i: int, a: int, b: int) -> Example:
    """A GenRM judgment: the index of a solution's first wrong step, or -1 (the compact
    rendering: the full instruction alone is longer than a scaled prompt)."""
    from reasonrl_fast.protocol import render

    flawed = i % 2
    steps = [f"{a}+{b}={a + b + flawed}"]
    truth = str(0 if flawed else -1)
    return Example(render("compact", f"{a}+{b}", str(a + b), steps), "genrm", truth,
                   {"problem": f"{a}+{b}", "answer": str(a + b), "steps": steps}, f"\\boxed{{{truth}}}")


EXAMPLES: dict[str, Callable[[int, int, int], Example]] = {
    "math": _answer, "dapo": _answer, "boxed": _answer, "code": _program, "genrm": _verdict}
"""The i-th example (of the sum a+b) per scorer kind. An embedded task's own scorer kind
("module:function") has none: its records are not rehearsed from a file."""


def file_sources(data, split: str, i: int) -> list[str]:
    """The data_sources of the records of the i-th file of `data.<split>_files` (data: the data
    config; split: train or val): its records' own, in order of first appearance, where the file
    is on this machine; else the one its `data.<split>_sources` entry names. A ConfigError naming
    that key where neither says, where the entry contradicts the file, or where a source's scorer
    has no example here."""
    return _sources(getattr(data, f"{split}_files"), getattr(data, f"{split}_sources"), i,
                    f"data.{split}_sources", f"data.{split}_files")


def _sources(files: list[str], declared: list[str], i: int, key: str, files_key: str) -> list[str]:
    """`file_sources` of file i of `files` (`files_key`), whose sources `declared` (`key`) names."""
    from reasonrl_fast.rewards.score import scorer_for

    path = files[i]
    said = declared[i] if i < len(declared) else None
    if os.path.exists(path):
        from reasonrl_fast.data.records import load_records

        sources = list(dict.fromkeys(r["data_source"] for r in load_records(path)))
        if said is not None and said not in sources:
            raise ConfigError(f"{key}[{i}]={said!r}, but the records of {path} carry "
                              f"{', '.join(map(repr, sources))}")
    elif said is None:
        raise ConfigError(f"{key}[{i}]: {path} is not on this machine, and {key} does not say which "
                          f"data_source its records carry: give one per file of {files_key}, as "
                          f"data.prepare writes them (such as {key}=[math_dapo])")
    else:
        sources = [said]
    for source in sources:
        if scorer_for(source) not in EXAMPLES:
            raise ConfigError(f"{key}[{i}]: data_source {source!r} ({path}) is scored by "
                              f"{scorer_for(source)!r}, which has no stand-in records (one of "
                              f"{', '.join(EXAMPLES)}; data/stand_in.py EXAMPLES)")
    return sources


def stand_in_records(sources: list[str], count: int) -> list[tuple[dict, str]]:
    """`count` (verl-schema record, reference response) pairs, the i-th of `sources[i % len]`
    and of its scorer's kind (rewards/score.py `scorer_for`), the example of that kind
    (`EXAMPLES`)."""
    from reasonrl_fast.rewards.score import scorer_for

    out = []
    for i in range(count):
        source = sources[i % len(sources)]
        e = EXAMPLES[scorer_for(source)](i, *SUMS[i % len(SUMS)])
        record = {"data_source": source, "prompt": [{"role": "user", "content": e.content}], "ability": e.ability,
                  "reward_model": {"style": "rule", "ground_truth": e.ground_truth},
                  "extra_info": {**e.extra_info, "index": i}}
        out.append((record, e.response))
    return out


def records_for(cfg, train: int, val: int) -> dict[str, list[tuple[str, list[tuple[dict, str]]]]]:
    """The stand-in records of each data file setting, `train` per training file and `val` per
    validation file: {"data.train_files": [(recipe's file, pairs), ...], "data.val_files": ...,
    "data.val_sets[0].files": ...}."""
    d = cfg.data
    out = {f"data.{split}_files": [(path, stand_in_records(file_sources(d, split, i), count))
                                   for i, path in enumerate(getattr(d, f"{split}_files"))]
           for split, count in (("train", train), ("val", val))}
    for s, v in enumerate(d.val_sets):  # a validation set's files: "data.val_sets[s].files"
        at = f"data.val_sets[{s}]."
        out[f"{at}files"] = [(path, stand_in_records(_sources(v.files, v.sources, i, f"{at}sources", f"{at}files"),
                                                     val))
                             for i, path in enumerate(v.files)]
    return out


def longest_prompt(records: dict, tok) -> int:
    """The longest prompt of `records` (records_for's) in tokens, rendered as the trainer renders it."""
    from reasonrl_fast.data.records import prompt_ids

    return max((len(prompt_ids(r, tok)) for files in records.values() for _, pairs in files for r, _ in pairs),
               default=1)
