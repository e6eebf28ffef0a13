"""Checkpoint folders and the run directory that holds them.

`checkpoint-N/` holds the torch.distributed.checkpoint shards (model with Z-head, optimiser),
one `rng_rank{r}.safetensors` per rank, `trainer_state.json` (step, data position, run id, world
size and the list of every file the save wrote) and `hf/` (config + tokenizer, for merge).
Workers write into `checkpoint-N.tmp/`; the driver renames it once everything is there.

Nothing here is ever unpickled: RNG and scheduler states are a uint8 tensor in safetensors plus
JSON. DCP's own `.metadata` is a pickle, though, so a checkpoint directory is trusted input (like
any PyTorch checkpoint); we refuse one that other users could have written to."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import stat
import uuid

import torch
from safetensors import safe_open
from safetensors.torch import save_file

_NAME = re.compile(r"^checkpoint-(\d+)$")
STATE = "trainer_state.json"


class CheckpointError(RuntimeError):
    """A checkpoint or run directory we must not use; the message says why and what to do."""


# ---------------------------------------------------------------------- per-rank RNG states

def rng_file(path: str, rank: int) -> str:
    return os.path.join(path, f"rng_rank{rank}.safetensors")


def save_rng(path: str, rank: int, sched) -> None:
    """This process's torch and Python RNG states and the LR-scheduler state, without pickle."""
    meta = {"python": json.dumps(random.getstate()), "sched": json.dumps(sched.state_dict())}
    save_file({"torch": torch.get_rng_state()}, rng_file(path, rank), metadata=meta)


def load_rng(path: str, rank: int, sched) -> None:
    """Restore what save_rng wrote; a rank beyond the saved world size reuses rank % saved."""
    world = read_state(path).get("world_size", 1)
    f = rng_file(path, rank % world)
    try:
        with safe_open(f, framework="pt") as st:
            torch_state, meta = st.get_tensor("torch"), st.metadata()
        python_state, sched_state = json.loads(meta["python"]), json.loads(meta["sched"])
    except Exception as e:  # noqa: BLE001 - any malformed file ends up as one clear error
        raise CheckpointError(f"{f}: not an RNG state file written by the trainer ({e})") from None
    torch.set_rng_state(torch_state)
    random.setstate(as_tuple(python_state))
    sched.load_state_dict(sched_state)


def as_tuple(x):
    """JSON turns random.getstate()'s nested tuples into lists; setstate wants them back."""
    return tuple(as_tuple(v) for v in x) if isinstance(x, list) else x


# ---------------------------------------------------------------------- writing a checkpoint

def tmp_path(output_dir: str, step: int) -> str:
    path = os.path.join(output_dir, f"checkpoint-{step}.tmp")
    shutil.rmtree(path, ignore_errors=True)  # leftovers of a crash mid-save
    os.makedirs(path)
    return path


def finalize(tmp: str, state: dict, tokenizer, hf_config, keep: int) -> str:
    """Write the HF metadata, then the driver's state with the list of every file, then publish
    the checkpoint atomically and prune this run's older checkpoints. `state` needs `step`,
    `run_id` and `world_size`."""
    hf = os.path.join(tmp, "hf")
    tokenizer.save_pretrained(hf)
    hf_config.save_pretrained(hf)
    state = dict(state, files=_sizes(tmp))
    with open(os.path.join(tmp, STATE), "w") as f:
        json.dump(state, f)
    _drop_group_other_write(tmp)
    final = tmp[: -len(".tmp")]
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    prune(os.path.dirname(final), state["run_id"], state["step"], keep)
    return final


def _sizes(root: str) -> dict[str, int]:
    out = {}
    for d, _, files in os.walk(root):
        for name in files:
            p = os.path.join(d, name)
            out[os.path.relpath(p, root)] = os.path.getsize(p)
    return out


def _drop_group_other_write(root: str) -> None:
    """A umask of 002 would make our own files group-writable, and load would then refuse them."""
    for d, _, files in os.walk(root):
        for p in [d] + [os.path.join(d, n) for n in files]:
            with contextlib.suppress(OSError):
                os.chmod(p, stat.S_IMODE(os.stat(p).st_mode) & ~0o022)


def prune(output_dir: str, run_id: str, step: int, keep: int) -> None:
    """Delete this run's checkpoints older than its newest `keep` up to `step`. Another run's
    checkpoints are never touched; later ones of this run (a timeline abandoned by falling back
    to an earlier checkpoint) are replaced when the run gets there."""
    if keep <= 0:
        return
    mine = [p for s, p in list_checkpoints(output_dir) if s <= step and _run_id(p) == run_id]
    for old in mine[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------- reading a checkpoint

def list_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """Every `checkpoint-N` folder (complete or not), oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(m.group(1)), os.path.join(output_dir, n)) for n in os.listdir(output_dir)
             if (m := _NAME.match(n)) and os.path.isdir(os.path.join(output_dir, n))]
    return sorted(found)


def read_state(path: str) -> dict:
    with open(os.path.join(path, STATE)) as f:
        return json.load(f)


def _run_id(path: str) -> str | None:
    try:
        return read_state(path).get("run_id")
    except (OSError, ValueError):
        return None


def missing_files(path: str) -> list[str]:
    """What a complete checkpoint has and `path` lacks (empty: complete): every file the save
    listed in trainer_state.json, with its size, and each rank's RNG file and DCP's .metadata."""
    try:
        state = read_state(path)
    except FileNotFoundError:
        return [STATE]
    except (OSError, ValueError) as e:
        return [f"{STATE} (unreadable: {e})"]
    if "files" not in state or "world_size" not in state:
        return [f"the file list in {STATE} (written by an older version of the trainer)"]
    files = dict(state["files"])
    needed = [".metadata"] + [os.path.basename(rng_file(path, r)) for r in range(state["world_size"])]
    out = [n for n in needed if n not in files]
    for rel, size in sorted(files.items()):
        p = os.path.join(path, rel)
        if not os.path.isfile(p):
            out.append(rel)
        elif os.path.getsize(p) != size:
            out.append(f"{rel} (size {os.path.getsize(p)}, written {size})")
    return out


def untrusted_files(path: str) -> list[str]:
    """Files and folders of the checkpoint that another user could have written: group- or
    world-writable, owned by another non-root user, or symbolic links (the trainer writes none)."""
    me, bad = os.getuid(), []
    entries = [path]
    for d, dirs, files in os.walk(path):
        entries += [os.path.join(d, n) for n in dirs + files]
    for p in entries:
        st = os.lstat(p) if p != path else os.stat(p)
        why = []
        if stat.S_ISLNK(st.st_mode):  # its own mode bits mean nothing
            why.append("symbolic link")
        elif st.st_mode & stat.S_IWOTH:
            why.append("world-writable")
        elif st.st_mode & stat.S_IWGRP:
            why.append("group-writable")
        if st.st_uid not in (me, 0):
            why.append(f"owned by uid {st.st_uid}")
        if why:
            bad.append(f"{p} ({', '.join(why)})")
    return bad


def check_trusted(path: str, override: str) -> None:
    bad = untrusted_files(path)
    if bad:
        shown = "; ".join(bad[:10]) + (f"; and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise CheckpointError(
            f"refusing to load {path}: loading a checkpoint can run code (torch.distributed.checkpoint's "
            f".metadata is a pickle), and other users could have written to: {shown}. Remove their write "
            f"access (chmod -R go-w), or pass {override} if you trust this checkpoint.")


def resolve_resume(output_dir: str, resume: str, warn=print) -> str | None:
    """auto: the newest complete checkpoint of output_dir (falling back past incomplete ones,
    with a warning) or None; never: None; else that path, which must be complete."""
    if resume == "never":
        return None
    if resume == "auto":
        for _, path in reversed(list_checkpoints(output_dir)):
            missing = missing_files(path)
            if not missing:
                return path
            warn(f"warning: skipping incomplete checkpoint {path} (missing: {', '.join(missing)})")
        return None
    missing = missing_files(resume)
    if missing:
        raise CheckpointError(f"trainer.resume={resume}: not a complete checkpoint, missing: {', '.join(missing)}")
    return resume


# ---------------------------------------------------------------------- the run directory

@contextlib.contextmanager
def locked(output_dir: str):
    """Hold an exclusive lock on the run directory for the whole run. A flock belongs to the
    open file, so the kernel releases it when this process exits, even on SIGKILL."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise CheckpointError(f"{output_dir} is in use by another trainer (pid {other}); wait for it "
                                  f"to finish or choose another trainer.output_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def prepare_run(cfg, warn=print) -> tuple[str | None, dict | None]:
    """Decide where the run starts: (checkpoint to resume or None, its trainer_state or None).
    A fresh run gets a new run id (state None) and must not mix with an earlier run's files."""
    t = cfg.trainer
    out = t.output_dir
    if t.overwrite:
        clear_run(out)
        return None, None
    resume_from = resolve_resume(out, t.resume, warn)
    if resume_from:
        if not t.trust_checkpoint:
            check_trusted(resume_from, "trainer.trust_checkpoint=true")
        return resume_from, read_state(resume_from)
    old = [p for _, p in list_checkpoints(out)]
    if old:
        raise CheckpointError(
            f"{out} holds checkpoints of an earlier run ({', '.join(os.path.basename(p) for p in old)}) "
            f"and trainer.resume={t.resume} starts a fresh run; pass trainer.overwrite=true to delete that run, "
            f"or choose another trainer.output_dir")
    if any(os.path.exists(os.path.join(out, n)) for n in _RUN_FILES):
        warn(f"{out}: no checkpoint to resume, starting over (the earlier run's metrics are replaced)")
    clear_run(out)
    return None, None


_RUN_FILES = ("metrics.jsonl", "tensorboard")


def clear_run(output_dir: str) -> None:
    """Delete an earlier run's checkpoints, metrics and TensorBoard events (trainer.overwrite)."""
    if not os.path.isdir(output_dir):
        return
    for name in os.listdir(output_dir):
        p = os.path.join(output_dir, name)
        if name in _RUN_FILES or _NAME.match(name.removesuffix(".tmp")):
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)


def new_run_id() -> str:
    return uuid.uuid4().hex
