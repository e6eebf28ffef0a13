"""Prompt records from jsonl or parquet files: verl's RL schema (docs/math.md §Data records) or
flat `prompt`/`answer` rows, each checked against its ability's ground-truth encoding, and
rendered into the text a model is given (its chat template, when it has one).

A record is a dict: `prompt` (a string, or chat messages `[{"role", "content"}]` as given),
`answer` (the ground truth), `data_source`, `ability` and `extra_info` (a dict or None).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import stat
import warnings
import zlib
from typing import Any

from reasonrl_fast.errors import UserError, one_line
from reasonrl_fast.rewards.score import scorer_for
from reasonrl_fast.util import loads_json

PROMPT_KEYS = ("prompt", "question", "problem")
ANSWER_KEYS = ("answer", "ground_truth")
ABILITIES = ("math", "code", "genrm")


class DataError(UserError, ValueError):
    """A records file that cannot be used; the message names the file (and row and key)."""


# ---------------------------------------------------------------- reading


def load_records(path: str) -> list[dict]:
    """Every record of a jsonl or parquet file, checked. Each way a file can be wrong is a
    DataError (a ValueError) naming the file, the row (1-based) and the key."""
    _check_path(path)
    rows = _read_parquet(path) if path.endswith(".parquet") else _read_jsonl(path)
    if not rows:
        raise DataError(f"{path}: the file is empty (no records)")
    return [_record(r, f"{path}:{i}") for i, r in rows]


def check_files(paths, setting: str) -> None:
    """A quick look at each records file, for a command to fail at once on a file it would
    otherwise reach minutes later: it exists, and its first record (a parquet file: its row
    count and columns) is one. load_records still checks every row."""
    for path in paths:
        try:
            _check_path(path)
            if path.endswith(".parquet"):
                meta = _parquet_file(path).metadata
                if meta.num_rows == 0:
                    raise DataError(f"{path}: the file is empty (no records)")
                _check_columns(path, meta.schema.to_arrow_schema().names)
            else:
                first = next(jsonl_rows(path), None)
                if first is None:
                    raise DataError(f"{path}: the file is empty (no records)")
                _record(first[1], f"{path}:{first[0]}")
        except DataError as e:
            raise DataError(f"{setting}: {e}") from None


def _check_path(path: str) -> None:
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    if os.path.isdir(path):
        raise DataError(f"{path} is a directory, not a jsonl or parquet file")
    if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or device: reading it could wait for ever
        raise DataError(f"{path} is not a regular file (a pipe or device?), not a jsonl or parquet file")


def _parquet_file(path: str):
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover
        raise ImportError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    with _parquet_errors(path):
        return pq.ParquetFile(path)


@contextlib.contextmanager
def _parquet_errors(path: str):
    """pyarrow's errors for a file that is no parquet, or a damaged one, as a DataError naming the
    file: ArrowInvalid (no magic bytes: cut off, or another kind of file; a bad column chunk),
    OSError (a footer that does not deserialize), any other ArrowException."""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable parquet file ({one_line(e)})") from None


def _check_columns(path: str, columns: list[str]) -> None:
    if not any(k in columns for k in PROMPT_KEYS) or not any(k in columns for k in ANSWER_KEYS + ("reward_model",)):
        raise DataError(f"{path}: a records file needs a prompt column ({' / '.join(PROMPT_KEYS)}) and a "
                        f"ground truth column (reward_model.ground_truth, {' / '.join(ANSWER_KEYS)}); "
                        f"its columns are {columns}")


def parquet_rows(path: str) -> tuple[list[str], list[tuple[int, dict]]]:
    """(column names, (row number, row) for each row) of a parquet file; a DataError naming the
    file for one that cannot be read."""
    f = _parquet_file(path)
    with _parquet_errors(path):
        table = f.read()
        return table.column_names, list(enumerate(table.to_pylist(), 1))


def _read_parquet(path: str) -> list[tuple[int, dict]]:
    columns, rows = parquet_rows(path)
    if not rows:  # before the columns: an empty file often has none
        return []
    _check_columns(path, columns)
    return rows


def _read_jsonl(path: str) -> list[tuple[int, dict]]:
    """(line number, record) for each non-blank line; a line that is not a JSON object is an
    error naming the file and line (blank lines are skipped but still counted)."""
    return list(jsonl_rows(path))


def jsonl_rows(path: str, compressed: bool = False):
    """(line number, JSON object) for each non-blank line of a JSON-lines file (`compressed`: a
    gzip one). Every way the file can fail to be one is a DataError naming the file, and the line
    where it is known: not JSON (or nested too deeply to parse), not an object, not UTF-8, a gzip
    file that is damaged or cut off (these two without a line: the text is decoded in blocks,
    ahead of the lines read)."""
    try:
        with (gzip.open if compressed else open)(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = loads_json(line)
                except ValueError as e:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({e})") from None
                if not isinstance(r, dict):
                    raise DataError(f"{path}:{lineno}: expected a JSON object (one record a line, with "
                                    f"its fields), got {type(r).__name__}")
                yield lineno, r
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a UTF-8 text file ({e.reason}); "
                        f"records files are jsonl or .parquet") from None
    except gzip.BadGzipFile as e:  # before OSError, its base: no gzip header, or a failed CRC
        raise DataError(f"{path}: not a readable gzip file ({e})") from None
    except (EOFError, zlib.error) as e:  # cut off before its end, or a damaged deflate stream
        raise DataError(f"{path}: a damaged or cut-off gzip file ({e})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None


def _record(r: dict, where: str) -> dict:
    prompt_key = next((k for k in PROMPT_KEYS if r.get(k) is not None), None)
    answer, answer_key = None, None
    if isinstance(r.get("reward_model"), dict) and r["reward_model"].get("ground_truth") is not None:
        answer, answer_key = r["reward_model"]["ground_truth"], "reward_model.ground_truth"
    else:
        answer_key = next((k for k in ANSWER_KEYS if r.get(k) is not None), None)
        answer = r.get(answer_key) if answer_key else None
    if prompt_key is None or answer is None:
        raise DataError(f"{where}: a record needs `prompt` and `answer` (or `reward_model.ground_truth`) "
                         f"fields, got {sorted(r)}")
    prompt = _check_prompt(r[prompt_key], f"{where}: `{prompt_key}`")
    data_source = str(r.get("data_source") or "math")
    ability = r.get("ability")
    ability = str(ability).lower() if ability else default_ability(data_source)
    extra = r.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        raise DataError(f"{where}: `extra_info` must be an object, got {type(extra).__name__}")
    answer = check_ground_truth(answer, ability, extra, f"{where}: `{answer_key}`")
    return {"prompt": prompt, "answer": answer, "data_source": data_source, "ability": ability,
            "extra_info": extra}


def default_ability(data_source: str) -> str:
    """The ability a record without one has: code sources (the scorer's routing) -> "code",
    GenRM judgments -> "genrm", everything else "math"."""
    if scorer_for(data_source) == "code":
        return "code"
    if data_source.lower().startswith("genrm"):
        return "genrm"
    return "math"


def _check_prompt(prompt: Any, where: str) -> str | list[dict]:
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list) or not prompt:
        raise DataError(f"{where} must be a string or a non-empty list of chat messages, "
                         f"got {type(prompt).__name__}")
    for k, m in enumerate(prompt):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}[{k}] must be a message {{\"role\": str, \"content\": str}}, got {m!r:.100}")
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


# ---------------------------------------------------- ground truth (docs/math.md §Data records)


def check_ground_truth(gt: Any, ability: str, extra_info: dict | None, where: str) -> Any:
    """The ground truth in its ability's encoding (a number read as its string, a code test
    object serialised as JSON), or a ValueError starting with `where`."""
    if ability == "code":
        return _check_code(gt, where)
    if ability == "genrm":
        return _check_genrm(gt, extra_info, where)
    # math, and any ability this package does not score by itself: an answer string
    if isinstance(gt, list) and gt and all(_is_answer(a) for a in gt):
        return [str(a) for a in gt]  # several acceptable answers (the math scorer takes any)
    if not _is_answer(gt):
        raise DataError(f"{where}: a {ability} ground truth must be a string (or a number), "
                         f"got {type(gt).__name__} {gt!r:.80}")
    if not str(gt).strip():
        raise DataError(f"{where}: the {ability} ground truth is empty")
    return str(gt)


def _is_answer(a: Any) -> bool:
    return isinstance(a, (str, int, float)) and not isinstance(a, bool)


def _check_code(gt: Any, where: str) -> str:
    from reasonrl_fast.rewards.code import parse_ground_truth

    try:
        parse_ground_truth(gt)
    except ValueError as e:
        raise DataError(f"{where}: {e}") from None
    return gt if isinstance(gt, str) else json.dumps(gt)


def _check_genrm(gt: Any, extra: dict | None, where: str) -> str:
    try:
        index = int(gt) if not isinstance(gt, (bool, float)) else None
    except ValueError:
        index = None
    if index is None or index < -1:
        raise DataError(f"{where}: a genrm ground truth is the index of the first wrong step, an integer "
                         f">= -1 (-1: none), got {gt!r:.80}")
    place = where.rsplit(": ", 1)[0]
    if not isinstance(extra, dict):
        raise DataError(f"{place}: `extra_info` of a genrm record must hold `problem`, `answer` and `steps`")
    missing = [k for k in ("problem", "answer", "steps") if extra.get(k) is None]
    if missing:
        raise DataError(f"{place}: `extra_info` of a genrm record lacks {missing}")
    steps = extra["steps"]
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        raise DataError(f"{place}: `extra_info.steps` must be a list of strings")
    if index >= len(steps):
        raise DataError(f"{where}: step index {index} is past the last of {len(steps)} steps in `extra_info.steps`")
    return str(index)


# ---------------------------------------------------------------- rendering


def uses_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_prompt(record: dict | str | list[dict], tokenizer) -> str:
    """The text a model is given: chat messages through the tokenizer's chat template (with the
    generation prompt, as verl does), or, for a tokenizer without one (the
    embedded character tokenizer), their contents joined by newlines; a string as it is. A record
    that was rendered already keeps its messages under `messages`, which take precedence."""
    prompt = record.get("messages", record.get("prompt")) if isinstance(record, dict) else record
    if isinstance(prompt, str):
        return prompt
    if uses_chat_template(tokenizer):
        return tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in prompt)


def prompt_ids(record: dict, tokenizer) -> list[int]:
    """The rendered prompt's token ids (`encode_prompts` of one record)."""
    return encode_prompts([record], tokenizer)[0]


def encode_prompts(records: list[dict], tokenizer) -> list[list[int]]:
    """The rendered prompts' token ids, in one call of the tokenizer per kind (a fast tokenizer
    encodes a list in Rust: a driver's 100k embedded prompts in a fraction of a second, where one
    call each took seconds). Text that came out of a chat template already holds the template's
    special tokens (a BOS included), so the tokenizer adds none of its own to it."""
    chat = uses_chat_template(tokenizer)
    out: list = [None] * len(records)
    for templated in (False, True):
        at = [i for i, r in enumerate(records)
              if (chat and isinstance(r.get("messages", r.get("prompt")), list)) == templated]
        if at:
            texts = [render_prompt(records[i], tokenizer) for i in at]
            for i, ids in zip(at, _encode(texts, tokenizer, add_special_tokens=not templated)):
                out[i] = ids
    return out


def _encode(texts: list[str], tokenizer, add_special_tokens: bool) -> list[list[int]]:
    """`tokenizer(texts)["input_ids"]`. A fast tokenizer's Rust half is asked directly where it
    would give the same ids (no truncation or padding of its own): transformers' wrapper spends
    more than the encoding itself building a Python encoding object per text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.truncation is None and backend.padding is None:
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
    return tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]


def problem_text(record: dict) -> str:
    """The problem without any chat template (what a judge is shown): `extra_info.question` where
    the record keeps the bare problem (the published FAPO data does, and its GenRM is shown that,
    without the policy's answer-format instruction), else the messages' contents joined, or the
    prompt string."""
    question = (record.get("extra_info") or {}).get("question")
    if isinstance(question, str) and question.strip():
        return question
    prompt = record.get("messages", record.get("prompt"))
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)


def filter_long(items: list[dict], tokenizer, max_len: int, name: str) -> list[dict]:
    """Drop prompts longer than `max_len` tokens once rendered (they would be truncated
    mid-question)."""
    keep = [it for it, ids in zip(items, encode_prompts(items, tokenizer)) if len(ids) <= max_len]
    if len(keep) < len(items):
        warnings.warn(f"{name}: dropped {len(items) - len(keep)} prompts longer than "
                      f"data.max_prompt_length={max_len} tokens", stacklevel=2)
    if not keep:
        raise DataError(f"{name}: the dataset is empty (after dropping prompts longer than "
                         f"data.max_prompt_length={max_len})")
    return keep
