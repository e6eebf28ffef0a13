"""Checkpoint folders and the run directory that holds them.

`checkpoint-N/` holds the torch.distributed.checkpoint shards (model with Z-head, optimiser),
one `rng_rank{r}.safetensors` per rank, `trainer_state.json` (step, data position, run id, world
size, and every file the save wrote with its size and CRC-32) and `hf/` (config + tokenizer, for
merge). Workers write into `checkpoint-N.tmp/`; the driver renames it once everything is there.
Resume, merge and eval check every file's size and checksum before reading any of it, so a
damaged file is named, never handed to torch.load (whose advice for a file it cannot read is to
turn weights_only off).

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
import zlib
from concurrent.futures import ThreadPoolExecutor

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from reasonrl_fast.errors import UserError

_NAME = re.compile(r"^checkpoint-(\d+)$")
STATE = "trainer_state.json"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint or run directory we must not use; the message says why and what to do."""


# ---------------------------------------------------------------------- per-rank RNG states

def rng_file(path: str, rank: int) -> str:
    return os.path.join(path, f"rng_rank{rank}.safetensors")


def save_rng(path: str, rank: int, sched) -> None:
    """This process's torch and Python RNG states and the LR-scheduler state, without pickle."""
    # default=float: torchao's AdamW (optim.bf16_stochastic_round) holds each group's lr as a 0-d
    # tensor, so the scheduler's base and last lrs are tensors; loaded back as floats, the
    # scheduler fills them into the optimizer's tensors all the same.
    meta = {"python": json.dumps(random.getstate()),
            "sched": json.dumps(sched.state_dict(), default=float)}
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
    sums = checksums(tmp)  # right after the workers wrote them: read back from the page cache
    state = dict(state, files={rel: size for rel, (size, _) in sums.items()},
                 checksums={rel: crc for rel, (_, crc) in sums.items()})
    with open(os.path.join(tmp, STATE), "w") as f:
        json.dump(state, f)
    _drop_group_other_write(tmp)
    final = tmp[: -len(".tmp")]
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    prune(os.path.dirname(final), state["run_id"], state["step"], keep)
    return final


def checksums(root: str, rels: list[str] | None = None) -> dict[str, tuple[int, str]]:
    """(size, CRC-32 as 8 hex digits) of every file under `root`, or of `rels` (relative paths),
    read in parallel threads (zlib.crc32 releases the GIL on large buffers; its cost on a save:
    benchmarks/RESULTS.md §11). A CRC catches damage (a flipped or zeroed block, a file
    overwritten in place); the trust checks, not the checksum, keep out other users' files."""
    if rels is None:
        rels = [os.path.relpath(os.path.join(d, n), root) for d, _, files in os.walk(root) for n in files]
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1, len(rels)))) as pool:
        return dict(zip(rels, pool.map(lambda rel: _crc32(os.path.join(root, rel)), rels)))


def _crc32(path: str, chunk: int = 4 << 20) -> tuple[int, str]:
    crc, size, buf = 0, 0, bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc, size = zlib.crc32(view[:n], crc), size + n
    return size, f"{crc:08x}"


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


def defects(path: str, warn=print) -> list[str]:
    """What keeps `path` from being a complete, undamaged checkpoint (empty: none): every file
    the save listed in trainer_state.json must be there with its size and its CRC-32, and each
    rank's RNG file and DCP's .metadata must be listed. A checkpoint written before checksums
    were recorded is checked by size only, which `warn` is told once."""
    try:
        state = read_state(path)
    except FileNotFoundError:
        return [STATE]
    except (OSError, ValueError) as e:
        return [f"{STATE} (unreadable: {e})"]
    if not isinstance(state, dict) or "files" not in state or "world_size" not in state:
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
    if out:
        return out
    want = state.get("checksums")
    if want is None:
        if os.path.realpath(path) not in _SIZE_ONLY_SAID:
            _SIZE_ONLY_SAID.add(os.path.realpath(path))
            warn(f"note: {path} has no checksums (written by an older version of the trainer): "
                 f"its files are checked by size only")
        return []
    try:
        got = checksums(path, sorted(files))
    except OSError as e:  # removed or made unreadable since its size was checked
        return [f"{os.path.relpath(e.filename or path, path)} (unreadable: {e.strerror})"]
    return [f"{rel} (damaged: CRC-32 {got[rel][1]}, written {want.get(rel)})"
            for rel in sorted(files) if got[rel][1] != want.get(rel)]


_SIZE_ONLY_SAID: set[str] = set()


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
    """auto: the newest complete, undamaged checkpoint of output_dir (falling back past
    incomplete or damaged ones, with a warning) or None; never: None; else that path, which must
    be complete and undamaged."""
    if resume == "never":
        return None
    if resume == "auto":
        for _, path in reversed(list_checkpoints(output_dir)):
            bad = defects(path, warn)
            if not bad:
                return path
            warn(f"warning: skipping incomplete or damaged checkpoint {path} (missing or damaged: "
                 f"{', '.join(bad)})")
        return None
    bad = defects(resume, warn)
    if bad:
        raise CheckpointError(f"trainer.resume={resume}: not a complete, undamaged checkpoint; "
                              f"missing or damaged: {', '.join(bad)}")
    return resume


def unreadable(path: str, e: BaseException) -> CheckpointError:
    """The error for a checkpoint that passed its checks but that torch.distributed.checkpoint
    cannot read (a damaged file of a checkpoint without checksums): it names the checkpoint and
    the failure's kind, without torch's advice to load with weights_only=False."""
    failures = getattr(e, "failures", None)  # DCP's CheckpointException: {rank: (exception, stack)}
    root = next(iter(failures.values())) if isinstance(failures, dict) and failures else e
    root = root[0] if isinstance(root, tuple) and root and isinstance(root[0], BaseException) else root
    first = (str(root).strip().splitlines() or [""])[0]
    detail = type(root).__name__ + (f": {first[:200]}" if first and "weights_only" not in str(root) else "")
    return CheckpointError(f"{path}: damaged, torch.distributed.checkpoint cannot read it ({detail}); "
                           f"use an earlier checkpoint")


# ---------------------------------------------------------------------- the run directory

@contextlib.contextmanager
def locked(output_dir: str):
    """Hold an exclusive lock on the run directory for the whole run. A flock belongs to the
    open file, so the kernel releases it when this process exits, even on SIGKILL."""
    make_run_dir(output_dir)
    try:
        fd = os.open(os.path.join(output_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise CheckpointError(f"trainer.output_dir={output_dir}: cannot be used as the run directory "
                              f"({e.strerror}: {e.filename})") from None
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


def make_run_dir(output_dir: str) -> None:
    """Create the run directory (with its parents), or a CheckpointError saying why not."""
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        what = "is not a directory" if os.path.exists(output_dir) and not os.path.isdir(output_dir) \
            else f"cannot be used as the run directory ({e.strerror}: {e.filename})"
        raise CheckpointError(f"trainer.output_dir={output_dir} {what}") from None


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
