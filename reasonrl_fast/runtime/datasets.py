"""Prompts for training and validation: the embedded tasks (reasonrl_fast/tasks/) or record files
(reasonrl_fast/data/records.py: the verl schema or flat `prompt`/`answer` rows), rendered once
for the run's tokenizer, behind a small seeded sampler whose position is saved in checkpoints."""

from __future__ import annotations

import random
from dataclasses import dataclass

from reasonrl_fast.data.records import filter_long, load_records, render_prompt
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.rewards.score import SCORER_SOURCES, check_sandbox
from reasonrl_fast.tasks import get_task
from reasonrl_fast.util import derive_seed

# ---------------------------------------------------------------- datasets


@dataclass
class ValSet:
    """A validation set as the loop validates it: `name` ("" for the one set of data.val_files
    or the embedded split, whose metrics are val/accuracy and val/pass@<k>; else an entry of
    data.val_sets, val/<name>/...), its rendered records, samples per prompt, pass@k's k,
    whether maj@n is reported, its sampling and its scorer."""

    name: str
    records: list[dict]
    n: int
    ks: list[int]
    maj: bool
    temperature: float
    top_p: float
    score_as: str | None = None
    """The data_source its records are scored as (the set's `scorer`); None: their own."""


def load_datasets(cfg, tokenizer) -> tuple[list[dict], list[ValSet]]:
    """The training records and the validation sets (`load_val_sets`)."""
    d = cfg.data
    if d.train_files:
        train = _read_files(d.train_files, d.train_sources, "data.train_")
    else:
        train = embedded_split(d, d.train_size, derive_seed(cfg.trainer.seed, "data", "train"), "train")
    # the embedded code task was checked with the config; files once their sources are known
    # (a caller that scores nothing may pass a config without a reward section)
    if d.train_files and hasattr(cfg, "reward"):
        check_sandbox(cfg, {r["data_source"] for r in train})
    # Rendered once here (the chat template when the tokenizer has one): everything downstream
    # encodes `prompt` as text; the messages stay under `messages`.
    train = filter_long(_rendered(train, tokenizer), tokenizer, d.max_prompt_length, "data.train_files")
    return train, load_val_sets(cfg, tokenizer)


def load_val_sets(cfg, tokenizer) -> list[ValSet]:
    """The validation sets: data.val_sets' entries, else the one set of data.val_files or of the
    embedded task's held-out split; none when training files come without validation files.
    Their records rendered and checked as the training records are. The eval command reads them
    alone (eval.val_sets: the training files need not be on its machine)."""
    d = cfg.data
    if d.val_sets:
        sets = [val_set(cfg, _val_records(cfg, v.files, v.sources, f"data.val_sets[{i}]."), v)
                for i, v in enumerate(d.val_sets)]
    elif d.val_files or not d.train_files:
        sets = [val_set(cfg, _val_records(cfg, d.val_files, d.val_sources, "data.val_"))]
    else:
        sets = []
    if (d.val_files or any(v.files for v in d.val_sets)) and hasattr(cfg, "reward"):
        check_sandbox(cfg, {r["data_source"] for s in sets for r in s.records})
    for s in sets:
        where = f"data.val_sets ({s.name})" if s.name else "data.val_files"
        s.records = filter_long(_rendered(s.records, tokenizer), tokenizer, d.max_prompt_length, where)
    return sets


def val_set(cfg, records: list[dict], entry=None) -> ValSet:
    """`records` as entry `entry` of data.val_sets, or (None) as the one set at rollout.val_n;
    the sampling a set leaves unset is rollout.val_sampling()'s."""
    r = cfg.rollout
    temperature, top_p = r.val_sampling()
    if entry is None:
        return ValSet("", records, r.val_n, [r.val_n] if r.val_n > 1 else [], False, temperature, top_p)
    return ValSet(entry.name, records, entry.n, entry.ks(), entry.maj,
                  temperature if entry.temperature is None else entry.temperature,
                  top_p if entry.top_p is None else entry.top_p,
                  SCORER_SOURCES[entry.scorer] if entry.scorer else None)


def _val_records(cfg, files: list[str], sources: list[str], key: str) -> list[dict]:
    """A validation set's records: its files', or the embedded task's held-out split."""
    if files:
        return _read_files(files, sources, key)
    return embedded_split(cfg.data, cfg.data.val_size, derive_seed(cfg.trainer.seed, "data", "val"), "val")


def _read_files(paths: list[str], declared: list[str], key: str) -> list[dict]:
    """The records of every file of `paths` (`key`files), in order. Where `declared`
    (`key`sources) names a file's data_source (the recipe's claim, which the CPU rehearsal
    stands in for), its records must carry it: a recipe that names the wrong set fails here,
    not after a run."""
    out = []
    for i, path in enumerate(paths):
        records = load_records(path)
        if i < len(declared) and records and declared[i] not in {r["data_source"] for r in records}:
            carried = sorted({r["data_source"] for r in records})
            raise ConfigError(f"{key}sources[{i}]={declared[i]!r}, but the records of {path} carry "
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
