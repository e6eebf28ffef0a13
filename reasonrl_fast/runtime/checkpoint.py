"""Checkpoint folders and the run directory that holds them.

`checkpoint-N/` holds the torch.distributed.checkpoint shards (model with Z-head, optimiser),
one `rng_rank{r}.safetensors` per rank, `trainer_state.json` (step, data position, run id, world
size, and every file the save wrote with its size and CRC-32) and `hf/` (config + tokenizer, for
merge). Workers write into `checkpoint-N.tmp/`; the driver renames it once everything is there.
Resume, merge and eval check every file's size and checksum before reading any of it, so a
damaged file is named, never handed to torch.load (whose advice for a file it cannot read is to
turn weights_only off). Every file of a checkpoint that we read ourselves goes through
open_trusted: regular files inside it only (no FIFO, device or symbolic link), no larger than
they may be, and only the names a save lists (no path leading out of it).

Nothing here is ever unpickled: RNG and scheduler states are a uint8 tensor in safetensors plus
JSON. DCP's own `.metadata` is a pickle, though, so a checkpoint directory is trusted input (like
any PyTorch checkpoint); we refuse one that other users could have written to."""

from __future__ import annotations

import contextlib
import errno
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
from safetensors.torch import load as safetensors_load
from safetensors.torch import save_file

from reasonrl_fast.errors import UserError
from reasonrl_fast.runtime import owned

_NAME = re.compile(r"^checkpoint-(\d+)$")
STATE = "trainer_state.json"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint or run directory we must not use; the message says why and what to do."""


# ---------------------------------------------------------------------- opening a checkpoint's files

# trainer_state.json and a rank's RNG file: kilobytes each (the file list grows by ~100 bytes a
# file); anything larger was not written by the trainer. Every other file is capped at the size
# trainer_state.json lists for it (hf/tokenizer.json alone can be ~10 MB).
SMALL_MAX = 8 << 20
_ENTRY_RULE = "a file name in the checkpoint, or hf/NAME"


class NotAFile(CheckpointError):
    """A checkpoint entry that must not be read: not a regular file of the checkpoint (a FIFO
    would block the reader for ever, /dev/zero would fill its memory), or larger than it may be."""

    def __init__(self, root: str, rel: str, why: str):
        self.rel, self.why = rel, why
        super().__init__(f"{os.path.join(root, rel)}: {why}")


def entry_ok(rel) -> bool:
    """Whether `rel` has the shape of a name the save lists: DCP's files and the RNG files at the
    top, the tokenizer and config in hf/ (finalize lists exactly these). No absolute path, '..',
    empty part or NUL: a file list must not make us read (or print the CRC of) a file elsewhere."""
    parts = rel.split("/") if isinstance(rel, str) else []
    return (0 < len(parts) <= 2 and (len(parts) == 1 or parts[0] == "hf")
            and all(p not in ("", ".", "..") and "\0" not in p for p in parts))


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return what
    return "not a regular file"


@contextlib.contextmanager
def open_trusted(root: str, rel: str, max_bytes: int | None):
    """The binary file `rel` of the checkpoint `root`, opened so that only a regular file inside
    it is ever read, else NotAFile (FileNotFoundError where it is missing). Every read of a
    checkpoint's own files goes through here.

    Symbolic links are refused, not resolved: the trainer writes none, check_trusted already calls
    them untrusted, and a resolved link could point at a file the checkpoint's writer cannot change
    but we can read. Each folder on the way is opened with O_NOFOLLOW and the file relative to it,
    so no link anywhere below `root` is followed (`root` itself is the user's own argument). The
    lstat says what the entry is before anything opens it; O_NONBLOCK keeps a FIFO swapped in after
    the lstat from blocking the open, and the fstat of the opened file must show the same regular
    file (device and inode), so a swap between the two is caught. `max_bytes` caps the size (None:
    no cap); callers read at most that many bytes, since a file can grow after the fstat."""
    if not entry_ok(rel):
        raise NotAFile(root, rel, f"not {_ENTRY_RULE}")
    *folders, name = rel.split("/")
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        for d in folders:
            st = os.stat(d, dir_fd=fds[-1], follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise NotAFile(root, rel, f"{d} is {_kind(st.st_mode)}, not a folder")
            fds.append(os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
        before = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
        if not stat.S_ISREG(before.st_mode):
            raise NotAFile(root, rel, f"{_kind(before.st_mode)}, not a regular file")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fds[-1])
        except OSError as e:
            if e.errno == errno.ELOOP:  # a symbolic link swapped in after the lstat
                raise NotAFile(root, rel, "a symbolic link, not a regular file") from None
            raise
    finally:
        for d in fds:
            os.close(d)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise NotAFile(root, rel, "replaced while it was being opened")
        if max_bytes is not None and st.st_size > max_bytes:
            raise NotAFile(root, rel, f"{st.st_size} bytes, more than the {max_bytes} it may hold")
        yield f


def read_trusted(root: str, rel: str, max_bytes: int) -> bytes:
    """The contents of `rel` (open_trusted), at most `max_bytes` of them."""
    with open_trusted(root, rel, max_bytes) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew after the fstat
        raise NotAFile(root, rel, f"more than the {max_bytes} bytes it may hold")
    return data


def int_in(x, lo: int, hi: int | None, what: str) -> int:
    """`x` if it is an int (not a bool) in [lo, hi] (hi None: unbounded), else ValueError."""
    if type(x) is not int or x < lo or (hi is not None and x > hi):
        most = f" and at most {hi}" if hi is not None else ""
        raise ValueError(f"{what} must be an integer of at least {lo}{most}, not {repr(x)[:60]}")
    return x


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
    torch_state, python_state, sched_state = read_rng(path, rank, sched.state_dict())
    torch.set_rng_state(torch_state)
    random.setstate(python_state)
    sched.load_state_dict(sched_state)


def read_rng(path: str, rank: int, like: dict | None = None) -> tuple[torch.Tensor, tuple, dict]:
    """(torch state, Python state, scheduler state) of rank's RNG file, each checked to be what
    the setters take (a file whose checksum was recomputed after a change passes the checksum),
    else a CheckpointError naming the file. `like`: the scheduler's state_dict now, whose shape
    the saved one must have."""
    try:
        world = int_in(read_state(path).get("world_size", 1), 1, None, "world_size")
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{os.path.join(path, STATE)}: unreadable ({e})") from None
    name = os.path.basename(rng_file(path, rank % world))
    f = os.path.join(path, name)
    try:
        data = read_trusted(path, name, SMALL_MAX)
    except FileNotFoundError:
        raise CheckpointError(f"{f}: missing (every rank's RNG file is part of a checkpoint)") from None
    try:
        tensors, meta = _safetensors(data)
        t = tensors.get("torch")
        want = torch.get_rng_state()
        if t is None or t.dtype != want.dtype or t.shape != want.shape:
            found = "nothing" if t is None else f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"
            raise ValueError(f"torch: a uint8 tensor of {want.numel()} values expected, found {found}")
        python_state = python_rng_state(json.loads(meta["python"]))
        sched_state = json.loads(meta["sched"])
        _check_like(sched_state, like if like is not None else {}, "sched")
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - any malformed file ends up as one clear error
        raise CheckpointError(f"{f}: not an RNG state file written by the trainer "
                              f"({type(e).__name__}: {e})") from None
    return t, python_state, sched_state


def _safetensors(data: bytes) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors and the string metadata of a safetensors file held in memory (safe_open wants
    a path, which would be opened again without the checks of open_trusted). The format: an
    8-byte little-endian header length, the JSON header, the tensor data."""
    tensors = safetensors_load(data)  # checks the header against the data
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8:8 + n]).get("__metadata__") or {}
    if not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("metadata values must be strings")
    return tensors, meta


def python_rng_state(x) -> tuple:
    """random.getstate() read back from JSON, checked (random.setstate would take some damage
    silently and fail on the rest with a bare TypeError): version 3, 624 32-bit words and the
    position in them, and the cached Gaussian or null."""
    if not (isinstance(x, list) and len(x) == 3 and x[0] == 3 and isinstance(x[1], list)
            and len(x[1]) == 625 and all(type(v) is int and 0 <= v < 2**32 for v in x[1])
            and x[1][-1] <= 624 and (x[2] is None or type(x[2]) is float)):
        raise ValueError("Python's random state must be [3, [625 integers below 2**32, the last "
                         "at most 624], null or a float]")
    return as_tuple(x)


def _check_like(saved, current, where: str) -> None:
    """`saved` (JSON) has the shape of `current` (a state_dict now): the same kinds of values,
    lists of the same lengths, for the keys both have. Numbers may have been tensors (see
    save_rng); a key only one of them has is left to load_state_dict."""
    if isinstance(current, dict):
        if not isinstance(saved, dict):
            raise ValueError(f"{where}: an object expected, found {type(saved).__name__}")
        for k in saved.keys() & current.keys():
            _check_like(saved[k], current[k], f"{where}.{k}")
    elif isinstance(current, (list, tuple)):
        if not isinstance(saved, list) or len(saved) != len(current):
            raise ValueError(f"{where}: a list of {len(current)} expected")
        for i, (a, b) in enumerate(zip(saved, current)):
            _check_like(a, b, f"{where}[{i}]")
    elif isinstance(current, bool) or current is None or isinstance(current, str):
        if type(saved) is not type(current):
            raise ValueError(f"{where}: {type(current).__name__} expected, found {type(saved).__name__}")
    elif isinstance(current, int):
        if type(saved) is not int:
            raise ValueError(f"{where}: an integer expected, found {saved!r}"[:200])
    elif isinstance(current, (float, torch.Tensor)):
        if type(saved) not in (int, float) or saved != saved:
            raise ValueError(f"{where}: a number expected, found {saved!r}"[:200])


def as_tuple(x):
    """JSON turns random.getstate()'s nested tuples into lists; setstate wants them back."""
    return tuple(as_tuple(v) for v in x) if isinstance(x, list) else x


# ---------------------------------------------------------------------- writing a checkpoint

def tmp_path(output_dir: str, step: int) -> str:
    path = os.path.join(output_dir, f"checkpoint-{step}.tmp")
    _remove_ours(path)  # leftovers of a crash mid-save
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
    _remove_ours(final)
    os.rename(tmp, final)
    prune(os.path.dirname(final), state["run_id"], state["step"], keep)
    return final


def checksums(root: str, rels: list[str] | None = None,
              caps: dict[str, int] | None = None) -> dict[str, tuple[int, str]]:
    """(size, CRC-32 as 8 hex digits) of every file under `root`, or of `rels` (relative paths,
    each read through open_trusted and at most caps[rel] + 1 bytes of it), read in parallel threads
    (zlib.crc32 releases the GIL on large buffers; its cost on a save: benchmarks/RESULTS.md §11).
    A CRC catches damage (a flipped or zeroed block, a file overwritten in place); the trust
    checks, not the checksum, keep out other users' files."""
    if rels is None:
        rels = [os.path.relpath(os.path.join(d, n), root) for d, _, files in os.walk(root) for n in files]
    caps = caps or {}
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1, len(rels)))) as pool:
        return dict(zip(rels, pool.map(lambda rel: _crc32(root, rel, caps.get(rel)), rels)))


def _crc32(root: str, rel: str, cap: int | None, chunk: int = 4 << 20) -> tuple[int, str]:
    crc, size, buf = 0, 0, bytearray(chunk)
    view = memoryview(buf)
    try:
        with open_trusted(root, rel, cap) as f:
            # one byte past the cap is enough to see the size differs
            while (cap is None or size <= cap) and (n := f.readinto(buf)):
                crc, size = zlib.crc32(view[:n], crc), size + n
    except OSError as e:  # opened relative to its folder: e.filename would lack the folder
        raise OSError(e.errno, e.strerror, rel) from None
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


def is_checkpoint_name(path: str) -> bool:
    """Whether `path` is named as a checkpoint folder (checkpoint-N, or checkpoint-N.tmp mid-save)."""
    return bool(_NAME.match(os.path.basename(os.path.normpath(path)).removesuffix(".tmp")))


def read_state(path: str) -> dict:
    """trainer_state.json of `path` (read through open_trusted, at most SMALL_MAX bytes): a JSON
    object, else ValueError; OSError or NotAFile where it cannot be read."""
    data = read_trusted(path, STATE, SMALL_MAX)
    try:
        state = json.loads(data)
    except RecursionError:  # brackets nested deeper than the decoder goes
        raise ValueError("nested too deeply") from None
    if not isinstance(state, dict):
        raise ValueError("not a JSON object")
    return state


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
    A fresh run gets a new run id (state None) and must not mix with an earlier run's files; a
    resumed one must keep the settings its checkpoint cannot do without (runtime/resume.py)."""
    t = cfg.trainer
    out = t.output_dir
    refuse_foreign(out)  # what the run would delete or overwrite must be a run's of this trainer
    if t.overwrite:
        clear_run(out)
        return None, None
    resume_from = resolve_resume(out, t.resume, warn)
    if resume_from:
        if not t.trust_checkpoint:
            check_trusted(resume_from, "trainer.trust_checkpoint=true")
        state = resume_state(resume_from)
        from reasonrl_fast.runtime.resume import check_resume  # it imports this module

        check_resume(resume_from, state, cfg, warn)  # a setting it cannot change is refused here
        return resume_from, state
    old = [p for _, p in list_checkpoints(out)]
    if old:
        raise CheckpointError(
            f"{out} holds checkpoints of an earlier run ({', '.join(os.path.basename(p) for p in old)}) "
            f"and trainer.resume={t.resume} starts a fresh run; pass trainer.overwrite=true to delete that run, "
            f"or choose another trainer.output_dir")
    if any(os.path.exists(os.path.join(out, n)) for n in owned.RUN_FILES):
        warn(f"{out}: no checkpoint to resume, starting over (the earlier run's metrics are replaced)")
    clear_run(out)
    return None, None


def resume_state(path: str) -> dict:
    """The checkpoint's trainer_state.json with what the driver restores checked (step, data
    position, Python RNG state), and every rank's RNG file checked as the workers will read it:
    a file whose checksum matches but whose contents are not what the trainer writes is a
    CheckpointError naming it now, before any worker starts."""
    try:
        state = read_state(path)
        file_list(state)  # world_size among them
        int_in(state.get("step"), 0, None, "step")
        sampler = state.get("sampler")
        if not isinstance(sampler, dict):
            raise ValueError("sampler must be an object")
        for k in ("epoch", "pos"):
            int_in(sampler.get(k), 0, None, f"sampler.{k}")
        python_rng_state(state.get("python_rng"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{os.path.join(path, STATE)}: not what the trainer writes ({e})") from None
    for r in range(state["world_size"]):
        read_rng(path, r)
    return state


def refuse_foreign(output_dir: str) -> None:
    """A CheckpointError naming what in `output_dir` a run would delete or overwrite but this
    trainer did not write (runtime/owned.py)."""
    bad = owned.foreign_files(output_dir)
    if bad:
        raise CheckpointError(
            f"trainer.output_dir={output_dir} holds {', '.join(bad)}, which this trainer did not write (no "
            f"config.yaml of its own beside them, or a checkpoint folder with files a save does not write) "
            f"and a run would delete or overwrite: move them away, or choose another trainer.output_dir")


def _remove_ours(path: str) -> None:
    if os.path.lexists(path):
        if not owned.our_checkpoint(path):
            raise CheckpointError(f"{path}: not a checkpoint this trainer wrote, refusing to replace it")
        shutil.rmtree(path)


def clear_run(output_dir: str) -> None:
    """Delete an earlier run's checkpoints, metrics, TensorBoard events and layout.json (a fresh run,
    trainer.overwrite): only a run's of this trainer, else a CheckpointError naming what is not
    and nothing deleted."""
    if not os.path.isdir(output_dir):
        return
    refuse_foreign(output_dir)
    for name in os.listdir(output_dir):
        p = os.path.join(output_dir, name)
        if name in owned.RUN_FILES or _NAME.match(name.removesuffix(".tmp")):
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)


def new_run_id() -> str:
    return uuid.uuid4().hex
