"""Checkpoint folders: `checkpoint-N/` holds the torch.distributed.checkpoint shards (model with
Z-head, optimiser), per-rank RNG states, `trainer_state.json` (step, data position) and `hf/`
(config + tokenizer, for merge). Workers write into `checkpoint-N.tmp/`; the driver renames it
once everything is there, so resume never sees a half-written checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil

_NAME = re.compile(r"^checkpoint-(\d+)$")


def tmp_path(output_dir: str, step: int) -> str:
    path = os.path.join(output_dir, f"checkpoint-{step}.tmp")
    shutil.rmtree(path, ignore_errors=True)  # leftovers of a crash mid-save
    os.makedirs(path)
    return path


def finalize(tmp: str, state: dict, tokenizer, hf_config, keep: int) -> str:
    """Write the driver's state and the HF metadata, then atomically publish the checkpoint."""
    with open(os.path.join(tmp, "trainer_state.json"), "w") as f:
        json.dump(state, f)
    hf = os.path.join(tmp, "hf")
    tokenizer.save_pretrained(hf)
    hf_config.save_pretrained(hf)
    final = tmp[: -len(".tmp")]
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    if keep > 0:
        for _, old in list_checkpoints(os.path.dirname(final))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """Complete checkpoints (renamed, with trainer_state.json), oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        m = _NAME.match(name)
        path = os.path.join(output_dir, name)
        if m and os.path.exists(os.path.join(path, "trainer_state.json")):
            found.append((int(m.group(1)), path))
    return sorted(found)


def resolve_resume(output_dir: str, resume: str) -> str | None:
    """auto: newest complete checkpoint or None; never: None; else the given path."""
    if resume == "never":
        return None
    if resume == "auto":
        ckpts = list_checkpoints(output_dir)
        return ckpts[-1][1] if ckpts else None
    if not os.path.exists(os.path.join(resume, "trainer_state.json")):
        raise FileNotFoundError(f"trainer.resume={resume}: not a complete checkpoint")
    return resume


def read_state(path: str) -> dict:
    with open(os.path.join(path, "trainer_state.json")) as f:
        return json.load(f)
