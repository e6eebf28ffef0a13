"""Reading a checkpoint's own files without trusting them, and the per-rank RNG files.

Every file of a checkpoint that we read ourselves goes through open_trusted: regular files inside
it only (no FIFO, device or symbolic link), no larger than they may be, and only the names a save
lists (no path leading out of it). Resume, merge and eval check every file's size and CRC-32
(`checksums`) before reading any of it, so a damaged file is named, never handed to torch.load
(whose advice for a file it cannot read is to turn weights_only off).

Nothing here is ever unpickled: RNG and scheduler states are a uint8 tensor in safetensors plus
JSON, each checked to be what the setters take before any of it is set."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import stat
import zlib
from concurrent.futures import ThreadPoolExecutor

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save_file

from reasonrl_fast.errors import UserError

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
