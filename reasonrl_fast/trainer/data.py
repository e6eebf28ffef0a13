"""Prompts for training and validation: the embedded tasks (reasonrl_fast/data/) or jsonl/parquet
files with `prompt` and `answer` (or the verl schema's `reward_model.ground_truth`) and an optional
`data_source`, behind a small seeded sampler whose position is saved in checkpoints."""

from __future__ import annotations

import json
import random
import warnings
from dataclasses import dataclass

from reasonrl_fast.data.addition import synthetic_split
from reasonrl_fast.data.code import code_split

# ---------------------------------------------------------------- files


def load_records(path: str) -> list[dict]:
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:  # pragma: no cover
            raise ImportError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
        rows = list(enumerate(pq.read_table(path).to_pylist(), 1))
    else:
        rows = _read_jsonl(path)
    out = []
    for i, r in rows:
        prompt = r.get("prompt", r.get("question", r.get("problem")))
        answer = r.get("answer", r.get("ground_truth"))
        if answer is None and isinstance(r.get("reward_model"), dict):  # the verl schema
            answer = r["reward_model"].get("ground_truth")
        if isinstance(prompt, list):  # chat format [{"role":..., "content":...}]
            prompt = "\n".join(m["content"] for m in prompt)
        if prompt is None or answer is None:
            raise ValueError(f"{path}:{i}: a record needs `prompt` and `answer` (or "
                             f"`reward_model.ground_truth`) fields, got {sorted(r)}")
        if not isinstance(answer, str):  # a number, or a code test spec given as an object
            answer = answer if isinstance(answer, (dict, list)) else str(answer)
        extra = r.get("extra_info") if isinstance(r.get("extra_info"), dict) else None
        # `data_source` picks the scorer (rewards/score.py); files without one hold math answers.
        out.append({"prompt": str(prompt), "answer": answer, "data_source": str(r.get("data_source") or "math"),
                    "extra_info": extra})
    return out


def _read_jsonl(path: str) -> list[tuple[int, dict]]:
    """(line number, record) for each non-blank line; a line that is not a JSON object is an
    error naming the file and line (blank lines are skipped but still counted)."""
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
            if not isinstance(r, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object with `prompt` and `answer` "
                                 f"fields, got {type(r).__name__}")
            rows.append((lineno, r))
    return rows


def filter_long(items: list[dict], tokenizer, max_len: int, name: str) -> list[dict]:
    """Drop prompts longer than `max_len` tokens (they would be truncated mid-question)."""
    keep = [it for it in items if len(tokenizer(it["prompt"])["input_ids"]) <= max_len]
    if len(keep) < len(items):
        warnings.warn(f"{name}: dropped {len(items) - len(keep)} prompts longer than "
                      f"data.max_prompt_length={max_len} tokens", stacklevel=2)
    if not keep:
        raise ValueError(f"{name}: the dataset is empty (after dropping prompts longer than "
                         f"data.max_prompt_length={max_len})")
    return keep


def load_datasets(cfg, tokenizer) -> tuple[list[dict], list[dict]]:
    d = cfg.data
    seed = cfg.trainer.seed * 1000
    if d.train_files:
        train = [r for p in d.train_files for r in load_records(p)]
    elif d.task == "code":
        train = code_split(d.train_size, seed + 1)
    else:
        train = synthetic_split(d.train_size, d.digits, seed + 1, d.carry_frac)
    if d.val_files:
        val = [r for p in d.val_files for r in load_records(p)]
    elif d.train_files:
        val = []
    elif d.task == "code":
        val = code_split(d.val_size, seed + 2)
    else:
        val = synthetic_split(d.val_size, d.digits, seed + 2, d.carry_frac)
    train = filter_long(train, tokenizer, d.max_prompt_length, "data.train_files")
    if val:
        val = filter_long(val, tokenizer, d.max_prompt_length, "data.val_files")
    return train, val


# ---------------------------------------------------------------- sampler


@dataclass
class Sampler:
    """Seeded epoch-wise shuffling; `state()`/`load_state()` make resume exact."""

    size: int
    seed: int
    shuffle: bool = True
    epoch: int = 0
    pos: int = 0

    def _order(self) -> list[int]:
        idx = list(range(self.size))
        if self.shuffle:
            random.Random(self.seed * 7919 + self.epoch).shuffle(idx)
        return idx

    def next(self, k: int) -> list[int]:
        out: list[int] = []
        order = self._order()
        while len(out) < k:
            if self.pos >= self.size:
                self.epoch, self.pos = self.epoch + 1, 0
                order = self._order()
            take = min(k - len(out), self.size - self.pos)
            out += order[self.pos:self.pos + take]
            self.pos += take
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state(self, s: dict) -> None:
        self.epoch, self.pos = int(s["epoch"]), int(s["pos"])
