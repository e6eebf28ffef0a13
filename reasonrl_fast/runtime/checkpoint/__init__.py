"""Checkpoints and the run directory that holds them, split by job:

- trusted.py: reading a checkpoint's files without trusting them (open_trusted, size caps, CRC-32s)
  and the per-rank RNG files (safetensors + JSON, never a pickle);
- format.py: what a checkpoint is: the driver's TrainState (trainer_state.json), writing one
  (tmp_path, finalize, prune) and reading one back (defects, resolve_resume, resume_state);
- run_dir.py: the run directory: its lock, and where a run starts (prepare_run, clear_run).

The names the trainer, merge, eval and the tests use are re-exported here, so callers import
`reasonrl_fast.runtime.checkpoint` whatever module holds a name."""

from reasonrl_fast.runtime.checkpoint.format import (
    TrainState,
    check_trusted,
    defects,
    file_list,
    finalize,
    is_checkpoint_name,
    list_checkpoints,
    prune,
    resolve_resume,
    resume_state,
    tmp_path,
    unreadable,
    untrusted_files,
)
from reasonrl_fast.runtime.checkpoint.run_dir import (
    clear_run,
    locked,
    make_run_dir,
    new_run_id,
    prepare_run,
    refuse_foreign,
)
from reasonrl_fast.runtime.checkpoint.trusted import (
    SMALL_MAX,
    STATE,
    CheckpointError,
    NotAFile,
    as_tuple,
    checksums,
    entry_ok,
    int_in,
    load_rng,
    open_trusted,
    python_rng_state,
    read_rng,
    read_state,
    read_trusted,
    rng_file,
    save_rng,
)

__all__ = [
    "SMALL_MAX", "STATE", "CheckpointError", "NotAFile", "TrainState", "as_tuple", "check_trusted",
    "checksums", "clear_run", "defects", "entry_ok", "file_list", "finalize", "int_in",
    "is_checkpoint_name", "list_checkpoints", "load_rng", "locked", "make_run_dir", "new_run_id",
    "open_trusted", "prepare_run", "prune", "python_rng_state", "read_rng", "read_state",
    "read_trusted", "refuse_foreign", "resolve_resume", "resume_state", "rng_file", "save_rng",
    "tmp_path", "unreadable", "untrusted_files",
]
