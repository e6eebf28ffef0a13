"""Which files of a run directory this trainer wrote, so that no command deletes or overwrites one
it did not (runtime/checkpoint/run_dir.py `refuse_foreign`, `clear_run`): the run files are a run's when
the config.yaml beside them is one the trainer wrote, a checkpoint folder when it holds only the
names a save writes. Queries only; the checkpoint module refuses."""

from __future__ import annotations

import os
import re
import stat

import yaml

_NAME = re.compile(r"^checkpoint-\d+(\.tmp)?$")  # checkpoint/format.py's names, mid-save ones included

# What a run writes into its directory besides checkpoints and .lock: config.yaml first (at the
# start), then these. They are this trainer's when config.yaml is (`our_config`).
RUN_FILES = ("metrics.jsonl", "tensorboard", "layout.json")
_SECTIONS = {"algo", "model", "data", "rollout", "optim", "trainer"}
# The names a save writes into a checkpoint folder (worker.py `save`: DCP's metadata and shards,
# save_rng; finalize: trainer_state.json, hf/); another trainer's checkpoint-N (Hugging Face's
# Trainer uses the same names) holds others. A save cut off leaves DCP's metadata as NAME.tmp.
_SAVED = re.compile(r"^((__\d+)?\.metadata(\.tmp)?|__\d+_\d+\.distcp|rng_rank\d+\.safetensors|trainer_state\.json|hf)$")


def our_config(path: str) -> bool:
    """Whether `path` is a config.yaml this trainer wrote: a regular file holding our sections."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        with open(path, encoding="utf-8") as f:
            loaded = yaml.safe_load(f.read(1 << 20))
    except (OSError, ValueError, yaml.YAMLError):  # UnicodeDecodeError is a ValueError
        return False
    return isinstance(loaded, dict) and _SECTIONS <= loaded.keys()


def our_checkpoint(path: str) -> bool:
    """Whether `path` (checkpoint-N or checkpoint-N.tmp) is a folder holding only what a save writes."""
    return os.path.isdir(path) and not os.path.islink(path) and all(_SAVED.match(n) for n in os.listdir(path))


def foreign_files(output_dir: str) -> list[str]:
    """What in `output_dir` a run would delete or overwrite that this trainer did not write: the
    run files (config.yaml, metrics.jsonl, tensorboard/, layout.json) unless config.yaml shows
    they are a run's of this trainer, and checkpoint folders holding what a save does not write."""
    if not os.path.isdir(output_dir):
        return []
    names = sorted(os.listdir(output_dir))
    out = [] if our_config(os.path.join(output_dir, "config.yaml")) else \
        [n for n in ("config.yaml", *RUN_FILES) if n in names]
    return out + [n for n in names if _NAME.match(n)
                  and not our_checkpoint(os.path.join(output_dir, n))]
