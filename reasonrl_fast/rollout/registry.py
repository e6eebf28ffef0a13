"""The rollout engines, by name (`rollout.backend`), and what each one knows about itself.

`ROLLOUTS` maps a name to the `EngineSpec` class that describes the engine, as "module:Class",
imported when it is asked for (verl's `_ROLLOUT_REGISTRY` idea): an engine whose packages are not
installed costs nothing until a run names it. A new engine is one module defining an `EngineSpec`
subclass (its facts, its memory, and `build`, which imports the engine itself and returns the
`Engine` of rollout/base.py that samples) and one line in the table (registry.py `ROLLOUTS`,
re-exported here); config's `rollout.backend` choices are its keys. A test or a plug-in adds one
with one line, `ROLLOUTS["name"] = "package.module:Class"`; an engine with settings of its own
declares them under `rollout.` (`section`, `Settings`).

The facts (everything but `build`) are answered without torch, so the planner, the config checks
and the driver's setup ask them on any machine. The loop, eval, the cluster's error notes, the
preflight and the planner ask the engine's spec; none of them compares the backend's name.
Throughout the project the spec is called `spec` and the engine it builds `engine`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from reasonrl_fast.registry import ROLLOUTS

FALLBACK = "hf"
"""The engine that runs on every machine and model (the CPU rehearsal samples with it where the
recipe's engine is not installed)."""


GIB = 2 ** 30


@dataclass
class MemoryTerm:
    """One row of the planner's table (plan.py) that an engine holds on one worker, in bytes."""

    name: str
    rollout: float
    """Held while the engine samples."""
    update: float
    """Held through the update (0 for an engine that sleeps, or frees it)."""
    note: str = ""
    knob: str = "engine"
    """The planner's advice for this row ("engine": the engine's memory settings; "" none)."""


@dataclass
class EngineMemory:
    """What an engine costs one worker, as the planner counts it (`EngineSpec.memory`)."""

    terms: list[MemoryTerm] = field(default_factory=list)
    sequences: float | None = None
    """Full-length sequences one engine holds in flight (its KV cache over one sequence's); None
    for an engine whose cache is as long as its batch (it has no size of its own to advise on)."""
    problems: list[str] = field(default_factory=list)
    """What stops the engine starting with these settings, whatever the total."""


class EngineSpec:
    """One generation engine: its facts (default methods: an engine that needs no check, writes
    no log and samples in the trainer's compute dtype), its memory, and `build`, which makes the
    `Engine` (rollout/base.py) a rollout worker (rollout/worker.py) samples with."""

    name = ""
    label = ""
    """How logs and errors name the engine ("vLLM")."""
    section = ""
    """The name of its own settings section under `rollout.` ("" none): `rollout.SECTION.*`."""
    Settings: type | None = None
    """The dataclass of that section (config/checks.py `Checks`, one docstring per field)."""
    needs_trainer_copy = False
    """The engine samples from a copy of the policy's Hugging Face model (`build`'s `lm`): eval
    must load one; an engine that loads the model directory itself gets None."""
    cpu_head_dims: tuple[int, ...] | None = None
    """The attention head sizes the engine can run on CPU (None: any)."""
    weights_between_tokens = False
    """The engine's `generate` takes `between_tokens` (rollout/handoff.py): new weights can land
    mid-generation (split placement's partial rollouts); others finish a generation first.
    `between_tokens(cfg)` says whether they do in a run."""
    tensor_parallel = False
    """The engine can shard the model over rollout.tensor_parallel_size workers (one rank in each,
    in the workers' process group); others hold it whole in every worker."""

    def available(self) -> bool:
        """Whether the engine's packages are installed here (looked up, not imported)."""
        return True

    def between_tokens(self, cfg) -> bool:
        """Whether a run of `cfg` hands the engine's generation new weights between two tokens
        (`weights_between_tokens`), or has its loads wait for the generation's end."""
        return self.weights_between_tokens

    def preflight(self, architectures: list[str] | None = None) -> str | None:
        """A UserError that says what to install or set when the engine cannot run here, or
        cannot load a model of `architectures` (a model config's; None: not checked); else what
        the setup logs about it ("vLLM 0.32.0"), or None."""
        return None

    def describe(self, cfg, out_dir: str, version: str | None) -> str | None:
        """The trainer's setup log line about the engine (`version`: what `preflight` returned),
        or None."""
        return None

    def log_path(self, out_dir: str, rank: int) -> str | None:
        """Where trainer worker `rank`'s engine writes its own log (under the run directory
        `out_dir`), or None when it writes none."""
        return None

    def error_note(self, out_dir: str, rank: int) -> str | None:
        """What the cluster adds to a failed worker's error: its engine log's last line, where
        there is one."""
        path = self.log_path(out_dir, rank)
        line = last_line(path) if path else ""
        return f"its {self.label or self.name} engine's last log line ({path}): {line}" if line else None

    def dtype(self, compute: str, device: str) -> str:
        """The engine's dtype ("float32", "bfloat16") for a trainer computing in `compute` on
        `device` ("cpu", "cuda")."""
        return compute

    def kv_cache_bytes(self, cfg, model_config, dtype: str, device: str, sequences: int | None = None) -> int | None:
        """The engine's KV cache in bytes when it is sized in bytes (for a model of
        `model_config`, config.json's dict or a transformers config, cached in `dtype`; `sequences`
        at once, default a trainer worker's rollout batch), else None."""
        return None

    def memory_share(self, cfg, device: str) -> float | None:
        """The share of the device the engine takes when it is sized by a share, else None."""
        return None

    def start_problem(self, cfg, shape, layout) -> str | None:
        """What stops the engine of `layout` starting for a model of `shape` (layout/shape.py) with
        these settings (a KV cache too small for one full-length sequence), else None. The
        planner and the trainer's preflight both ask."""
        return None

    def memory(self, cfg, shape, layout, device_bytes: float) -> EngineMemory:
        """What the engine of `layout` holds on one worker (one engine rank) for a model of
        `shape`, on a device of `device_bytes` (a GPU's memory, or a CPU worker's share of the
        host's): the planner's rows (plan.py `estimate`), how many full-length sequences it has
        room for, and what would stop it. The default counts nothing: an engine of its own says
        what it holds."""
        return EngineMemory()

    def build(self, cfg, layout, lm, model_path: str, tok, log=print, *, device=None, log_path: str | None = None):
        """The engine (an Engine, rollout/base.py) as the run's Layout (layout/resolve.py
        `resolve`) has it: sampling in `layout.rollout_dtype`, its KV cache `layout.kv_cache_bytes`
        (or its share of the GPU). `lm`: the policy's Hugging Face model, which an engine that
        `needs_trainer_copy` copies (others load `model_path`, its directory, themselves; the
        caller may pass None to them); `tok`: its tokenizer (the pad and end tokens); notes to
        `log`. `device` (a torch.device): where it samples (default the current CUDA device where
        `layout.device` is "cuda", else the CPU); its own log to `log_path`."""
        raise NotImplementedError


def engine_device(layout, device=None):
    """`device` as a torch.device, by default the one `layout` runs on (this process's current
    CUDA device)."""
    import torch

    if device is not None:
        return torch.device(device)
    return torch.device("cuda", torch.cuda.current_device()) if layout.device == "cuda" else torch.device("cpu")


def get_rollout(name: str) -> EngineSpec:
    """The spec of the engine called `name` (its class imported on first use, one instance per
    class path); a ValueError listing the known ones otherwise."""
    return ROLLOUTS.lookup(name)


def last_line(path: str) -> str:
    """The last non-empty line of a log file ('' when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [x.strip() for x in f.read().decode("utf-8", "replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


__all__ = ["FALLBACK", "GIB", "ROLLOUTS", "EngineMemory", "EngineSpec", "MemoryTerm", "engine_device", "get_rollout",
           "last_line"]
