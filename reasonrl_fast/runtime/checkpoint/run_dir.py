"""The run directory (trainer.output_dir): its lock, and deciding where a run starts
(prepare_run: resume a checkpoint, or start fresh after clearing an earlier run's files). Nothing
is deleted or overwritten that this trainer did not write (runtime/owned.py says what it wrote)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid

from reasonrl_fast.runtime import owned
from reasonrl_fast.runtime.checkpoint.format import (
    TrainState,
    check_trusted,
    is_checkpoint_name,
    list_checkpoints,
    resolve_resume,
    resume_state,
)
from reasonrl_fast.runtime.checkpoint.trusted import CheckpointError


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


def prepare_run(cfg, warn=print) -> tuple[str | None, TrainState | None]:
    """Decide where the run starts: (checkpoint to resume or None, its TrainState or None).
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
        from reasonrl_fast.runtime.resume import check_resume  # it imports this package

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


def refuse_foreign(output_dir: str) -> None:
    """A CheckpointError naming what in `output_dir` a run would delete or overwrite but this
    trainer did not write (runtime/owned.py)."""
    bad = owned.foreign_files(output_dir)
    if bad:
        raise CheckpointError(
            f"trainer.output_dir={output_dir} holds {', '.join(bad)}, which this trainer did not write (no "
            f"config.yaml of its own beside them, or a checkpoint folder with files a save does not write) "
            f"and a run would delete or overwrite: move them away, or choose another trainer.output_dir")


def clear_run(output_dir: str) -> None:
    """Delete an earlier run's checkpoints, metrics, TensorBoard events and layout.json (a fresh run,
    trainer.overwrite): only a run's of this trainer, else a CheckpointError naming what is not
    and nothing deleted."""
    if not os.path.isdir(output_dir):
        return
    refuse_foreign(output_dir)
    for name in os.listdir(output_dir):
        p = os.path.join(output_dir, name)
        if name in owned.RUN_FILES or is_checkpoint_name(name):
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)


def new_run_id() -> str:
    return uuid.uuid4().hex
