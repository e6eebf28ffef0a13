"""Prompts for training and validation: the embedded tasks (reasonrl_fast/tasks/) or record files
(reasonrl_fast/data/records.py: the verl schema or flat `prompt`/`answer` rows), rendered once
for the run's tokenizer, behind a small seeded sampler whose position is saved in checkpoints."""

from __future__ import annotations

import random
from dataclasses import dataclass

from reasonrl_fast.data.records import filter_long, load_records, render_prompt
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.rewards.score import check_sandbox
from reasonrl_fast.tasks import get_task
from reasonrl_fast.util import derive_seed

# ---------------------------------------------------------------- datasets


def load_datasets(cfg, tokenizer) -> tuple[list[dict], list[dict]]:
    d = cfg.data
    if d.train_files:
        train = _read_files(d, "train")
    else:
        train = embedded_split(d, d.train_size, derive_seed(cfg.trainer.seed, "data", "train"), "train")
    if d.val_files:
        val = _read_files(d, "val")
    elif d.train_files:
        val = []
    else:
        val = embedded_split(d, d.val_size, derive_seed(cfg.trainer.seed, "data", "val"), "val")
    # the embedded code task was checked with the config; files once their sources are known
    # (a caller that scores nothing may pass a config without a reward section)
    if (d.train_files or d.val_files) and hasattr(cfg, "reward"):
        check_sandbox(cfg, {r["data_source"] for r in train + val})
    # Rendered once here (the chat template when the tokenizer has one): everything downstream
    # encodes `prompt` as text; the messages stay under `messages`.
    train, val = _rendered(train, tokenizer), _rendered(val, tokenizer)
    train = filter_long(train, tokenizer, d.max_prompt_length, "data.train_files")
    if val:
        val = filter_long(val, tokenizer, d.max_prompt_length, "data.val_files")
    return train, val


def _read_files(d, split: str) -> list[dict]:
    """The records of every file of `data.<split>_files`, in order. Where `data.<split>_sources`
    names a file's data_source (the recipe's claim, which the CPU rehearsal stands in for), its
    records must carry it: a recipe that names the wrong set fails here, not after a run."""
    out = []
    for i, path in enumerate(getattr(d, f"{split}_files")):
        records = load_records(path)
        declared = getattr(d, f"{split}_sources")
        if i < len(declared) and records and declared[i] not in {r["data_source"] for r in records}:
            carried = sorted({r["data_source"] for r in records})
            raise ConfigError(f"data.{split}_sources[{i}]={declared[i]!r}, but the records of {path} carry "
                              f"{', '.join(map(repr, carried))}")
        out += records
    return out


def embedded_split(d, n: int, seed: int, part: str = "train") -> list[dict]:
    """`n` records of the built-in task `d.task` (d: the data config) for `part` (train or val)."""
    return get_task(d.task).split(d, n, seed, part)


def _rendered(items: list[dict], tokenizer) -> list[dict]:
    out = []
    for it in items:
        if isinstance(it["prompt"], list):
            it = {**it, "messages": it["prompt"], "prompt": render_prompt(it["prompt"], tokenizer)}
        out.append(it)
    return out


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
            random.Random(derive_seed(self.seed, "shuffle", self.epoch)).shuffle(idx)
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
