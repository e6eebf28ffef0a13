"""The rollout engines, by name (`rollout.backend`), and what each one knows about itself.

`ROLLOUTS` maps a name to the `Rollout` class that describes the engine, as "module:Class",
imported when it is asked for (verl's `_ROLLOUT_REGISTRY` idea): an engine whose packages are not
installed costs nothing until a run names it. A new engine is one module defining a `Rollout`
subclass (its facts, and `build`, which imports the engine itself) and one line in the table
(registry.py `ROLLOUTS`, re-exported here); config's `rollout.backend` choices are its keys. A
test or a plug-in adds one with one line, `ROLLOUTS["name"] = "package.module:Class"`; an engine
with settings of its own declares them under `rollout.` (`section`, `Settings`).

The facts (everything but `build`) are answered without torch, so the planner, the config checks
and the driver's setup ask them on any machine. The loop, eval, the cluster's error notes, the
preflight and the planner ask the engine's class; none of them compares the backend's name."""

from __future__ import annotations

import os

from reasonrl_fast.registry import ROLLOUTS

FALLBACK = "hf"
"""The engine that runs on every machine and model (the CPU rehearsal samples with it where the
recipe's engine is not installed)."""


class Rollout:
    """One generation engine: its facts (default methods: an engine that needs no check, writes
    no log and samples in the trainer's compute dtype) and `build`, which makes the
    `RolloutEngine` (rollout/base.py) a trainer worker or an eval worker samples with."""

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
    tensor_parallel = False
    """The engine can shard the model over rollout.tensor_parallel_size workers (one rank in each,
    in the workers' process group); others hold it whole in every worker."""

    def available(self) -> bool:
        """Whether the engine's packages are installed here (looked up, not imported)."""
        return True

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

    def build(self, cfg, lm, model_path: str, pad_id: int, eos_id: int, device, dtype, kv_bytes: int | None,
              log_path: str | None, log):
        """The engine (a RolloutEngine) on `device` (a torch.device), in `dtype` (a torch.dtype,
        what `dtype` decided): `lm` the policy's Hugging Face model where `needs_trainer_copy`
        (else None), `model_path` its directory, `kv_bytes` what `kv_cache_bytes` decided, its own
        log to `log_path`, notes to `log`."""
        raise NotImplementedError


class HF(Rollout):
    """The `hf` engine: the policy's Hugging Face model sampled with its KV cache (rollout/hf.py),
    on every device and model. Its facts live here, beside the base, because hf.py is torch
    through and through."""

    name = "hf"
    label = "hf"
    needs_trainer_copy = True

    def build(self, cfg, lm, model_path, pad_id, eos_id, device, dtype, kv_bytes, log_path, log):
        from reasonrl_fast.rollout.hf import HFRollout

        return HFRollout(lm, pad_id, eos_id, device, cfg.rollout.decoder, dtype)


def get_rollout(name: str) -> Rollout:
    """The engine called `name` (its class imported on first use, one instance per class path);
    a ValueError listing the known ones otherwise."""
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


__all__ = ["FALLBACK", "HF", "ROLLOUTS", "Rollout", "get_rollout", "last_line"]
