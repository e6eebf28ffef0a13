"""A checkpoint folder: what the driver's trainer_state.json holds (TrainState), writing one
(tmp_path, finalize, prune) and reading one back (defects, resolve_resume, resume_state).

`checkpoint-N/` holds the torch.distributed.checkpoint shards (model with Z-head, optimiser), one
`rng_rank{r}.safetensors` per rank, `trainer_state.json` (TrainState: step, data position, run id,
world size, the run's settings, and every file the save wrote with its size and CRC-32) and `hf/`
(config + tokenizer, for merge). Workers write their shards and RNG files into
`checkpoint-N.tmp/` (trainer/worker.py); the driver then writes its TrainState and renames the
folder (finalize), so a checkpoint is published whole or not at all.

DCP's own `.metadata` is a pickle, so a checkpoint directory is trusted input (like any PyTorch
checkpoint); we refuse one that other users could have written to (check_trusted)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import shutil
import stat
from dataclasses import dataclass, field

from reasonrl_fast.runtime import owned
from reasonrl_fast.runtime.checkpoint.trusted import (
    _ENTRY_RULE,
    STATE,
    CheckpointError,
    NotAFile,
    checksums,
    entry_ok,
    int_in,
    open_trusted,
    python_rng_state,
    read_rng,
    read_state,
    rng_file,
)

_NAME = re.compile(r"^checkpoint-(\d+)$")


# ---------------------------------------------------------------------- the driver's state

@dataclass(frozen=True)
class TrainState:
    """trainer_state.json: what the driver saves with each checkpoint and restores on resume.
    One type for the writer (loop.py `save` -> finalize), the checks (from_json, via
    resume_state) and the restore (`restore`), so the three cannot drift apart."""

    step: int  # the last step done
    run_id: str  # prune deletes only this run's older checkpoints
    world_size: int  # the ranks that wrote RNG files; more or fewer reuse them (load_rng)
    sampler: dict  # Sampler.state(): {"epoch", "pos"}
    python_rng: tuple  # random.getstate() of the driver
    # the run's settings (runtime/resume.py `settings`), which a resumed run compares its own
    # with; None in a checkpoint written before they were recorded (resume then reads config.yaml)
    config: dict | None = None
    # every file the save wrote: size and CRC-32 (filled in by finalize; None: predates checksums)
    files: dict[str, int] = field(default_factory=dict)
    checksums: dict[str, str] | None = None

    @classmethod
    def now(cls, step: int, run_id: str, world_size: int, sampler, settings: dict) -> TrainState:
        """The driver's state after `step`: `sampler`'s position and this process's Python RNG."""
        return cls(step, run_id, world_size, sampler.state(), random.getstate(), settings)

    def to_json(self) -> dict:
        """The JSON object trainer_state.json holds (`config` left out when there is none)."""
        out = {"step": self.step, "run_id": self.run_id, "world_size": self.world_size,
               "sampler": self.sampler, "python_rng": self.python_rng}
        if self.config is not None:
            out["config"] = self.config
        out["files"] = self.files
        if self.checksums is not None:
            out["checksums"] = self.checksums
        return out

    @classmethod
    def from_json(cls, state: dict) -> TrainState:
        """`state` (read_state's JSON object) checked to be what the trainer writes, every value
        the driver restores or relies on among them, else ValueError naming the first that is
        not: a file whose checksum was recomputed after a change passes the checksum."""
        files, sums = file_list(state)  # world_size among them
        int_in(state.get("step"), 0, None, "step")
        if not isinstance(state.get("run_id"), str):
            raise ValueError("run_id must be a string")
        sampler = state.get("sampler")
        if not isinstance(sampler, dict):
            raise ValueError("sampler must be an object")
        for k in ("epoch", "pos"):
            int_in(sampler.get(k), 0, None, f"sampler.{k}")
        python_rng = python_rng_state(state.get("python_rng"))
        config = state.get("config")
        if "config" in state and not isinstance(config, dict):
            raise ValueError("config (the run's settings) must be an object")
        return cls(state["step"], state["run_id"], state["world_size"], sampler, python_rng, config, files, sums)

    def restore(self, sampler) -> None:
        """Put the driver back where this state was saved: `sampler`'s position, the Python RNG."""
        sampler.load_state(self.sampler)
        random.setstate(self.python_rng)


# ---------------------------------------------------------------------- writing a checkpoint

def tmp_path(output_dir: str, step: int) -> str:
    path = os.path.join(output_dir, f"checkpoint-{step}.tmp")
    _remove_ours(path)  # leftovers of a crash mid-save
    os.makedirs(path)
    return path


def finalize(tmp: str, state: TrainState, tokenizer, hf_config, keep: int) -> str:
    """Write the HF metadata, then the driver's `state` with the list of every file, then publish
    the checkpoint atomically and prune this run's older checkpoints."""
    hf = os.path.join(tmp, "hf")
    tokenizer.save_pretrained(hf)
    hf_config.save_pretrained(hf)
    sums = checksums(tmp)  # right after the workers wrote them: read back from the page cache
    state = dataclasses.replace(state, files={rel: size for rel, (size, _) in sums.items()},
                                checksums={rel: crc for rel, (_, crc) in sums.items()})
    with open(os.path.join(tmp, STATE), "w") as f:
        json.dump(state.to_json(), f)
    _drop_group_other_write(tmp)
    final = tmp[: -len(".tmp")]
    _remove_ours(final)
    os.rename(tmp, final)
    prune(os.path.dirname(final), state.run_id, state.step, keep)
    return final


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




def _remove_ours(path: str) -> None:
    if os.path.lexists(path):
        if not owned.our_checkpoint(path):
            raise CheckpointError(f"{path}: not a checkpoint this trainer wrote, refusing to replace it")
        shutil.rmtree(path)


# ---------------------------------------------------------------------- reading a checkpoint

def list_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    """Every `checkpoint-N` folder (complete or not), oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(m.group(1)), os.path.join(output_dir, n)) for n in os.listdir(output_dir)
             if (m := _NAME.match(n)) and os.path.isdir(os.path.join(output_dir, n))]
    return sorted(found)


def is_checkpoint_name(path: str) -> bool:
    """Whether `path` is named as a checkpoint folder (checkpoint-N, or checkpoint-N.tmp mid-save)."""
    return bool(_NAME.match(os.path.basename(os.path.normpath(path)).removesuffix(".tmp")))


def _run_id(path: str) -> str | None:
    try:
        return read_state(path).get("run_id")
    except (OSError, ValueError, CheckpointError):
        return None


def file_list(state: dict) -> tuple[dict[str, int], dict[str, str] | None]:
    """trainer_state.json's `files` (name: size) and `checksums` (name: CRC-32, None if it
    predates them), checked to be what finalize writes, else ValueError naming the entry."""
    files, sums = state["files"], state.get("checksums")
    if not isinstance(files, dict):
        raise ValueError("`files` must map file names to sizes")
    for rel, size in files.items():
        if not entry_ok(rel):
            raise ValueError(f"`files` entry {rel!r} is not {_ENTRY_RULE}")
        int_in(size, 0, None, f"the size of `files` entry {rel!r}")
    if sums is not None and not (isinstance(sums, dict) and all(isinstance(v, str) for v in sums.values())):
        raise ValueError("`checksums` must map file names to CRC-32s")
    # each rank's RNG file is listed, which bounds the ranks the checks below name
    int_in(state["world_size"], 1, max(1, len(files)), "world_size")
    return files, sums


def defects(path: str, warn=print) -> list[str]:
    """What keeps `path` from being a complete, undamaged checkpoint (empty: none): every file
    the save listed in trainer_state.json must be there, a regular file of the checkpoint, with
    its size and its CRC-32, and each rank's RNG file and DCP's .metadata must be listed. A
    checkpoint written before checksums were recorded is checked by size only, which `warn` is
    told once. Every file is read through open_trusted, never past the size the list gives it."""
    try:
        state = read_state(path)
    except FileNotFoundError:
        return [STATE]
    except NotAFile as e:
        return [f"{STATE} ({e.why})"]
    except (OSError, ValueError) as e:
        return [f"{STATE} (unreadable: {e})"]
    if "files" not in state or "world_size" not in state:
        return [f"the file list in {STATE} (written by an older version of the trainer)"]
    try:
        files, want = file_list(state)
    except ValueError as e:
        return [f"{STATE} (malformed: {e})"]
    needed = [".metadata"] + [os.path.basename(rng_file(path, r)) for r in range(state["world_size"])]
    out = [n for n in needed if n not in files]
    for rel, size in sorted(files.items()):
        try:
            with open_trusted(path, rel, None) as f:
                got = os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            out.append(rel)
            continue
        except NotAFile as e:
            out.append(f"{rel} ({e.why})")
            continue
        except OSError as e:
            out.append(f"{rel} (unreadable: {e.strerror})")
            continue
        if got != size:
            out.append(f"{rel} (size {got}, written {size})")
    if out:
        return out
    if want is None:
        if os.path.realpath(path) not in _SIZE_ONLY_SAID:
            _SIZE_ONLY_SAID.add(os.path.realpath(path))
            warn(f"note: {path} has no checksums (written by an older version of the trainer): "
                 f"its files are checked by size only")
        return []
    try:
        got = checksums(path, sorted(files), caps=files)
    except NotAFile as e:  # replaced since its size was checked
        return [f"{e.rel} ({e.why})"]
    except OSError as e:  # removed or made unreadable since its size was checked
        return [f"{e.filename} (unreadable: {e.strerror})"]
    return [f"{rel} (damaged: CRC-32 {got[rel][1]}, written {want.get(rel)})" if got[rel][0] == files[rel]
            else f"{rel} (size changed while it was read)"
            for rel in sorted(files) if got[rel] != (files[rel], want.get(rel))]


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


def resume_state(path: str) -> TrainState:
    """The checkpoint's TrainState, checked (TrainState.from_json), and every rank's RNG file
    checked as the workers will read it: a file whose checksum matches but whose contents are not
    what the trainer writes is a CheckpointError naming it now, before any worker starts."""
    try:
        state = TrainState.from_json(read_state(path))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{os.path.join(path, STATE)}: not what the trainer writes ({e})") from None
    for r in range(state.world_size):
        read_rng(path, r)
    return state
