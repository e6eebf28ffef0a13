"""A virtual environment with TRL 1.16.0, for running TRL's own code beside our ops.

TRL pulls in accelerate and datasets, which the project's environment does not carry, and pins
its own transformers range, so TRL runs in a venv of its own: created once under
~/.cache/reasonrl_fast/venv-trl-1.16 (`python -m venv`, then torch 2.13.0, the local CPU wheel,
and TRL with pinned dependencies) and reused once its completion marker exists. The venv holds no
copy of reasonrl_fast: a child process puts the repository on PYTHONPATH and loads the extension
already built there, which is why torch must be exactly the version it was built against.
The same venv serves the TRL-vs-ours benchmark, so it holds TRL and its dependencies only."""

from __future__ import annotations

import os
from pathlib import Path

from tests.venvs import VenvError, ensure_venv

TRL_VERSION = "1.16.0"
VENV_NAME = "venv-trl-1.16"
# torch is the build the compiled extension links against; the others are what pip resolves for
# trl 1.16.0 with the project's transformers, pinned so a later release cannot change the test.
PACKAGES = ["torch==2.13.0", f"trl=={TRL_VERSION}", "transformers==5.24.0", "accelerate==1.15.0",
            "datasets==5.2.0"]
REPO = Path(__file__).resolve().parents[2]

TrlEnvError = VenvError


def ensure_trl_env(timeout: float = 1200.0) -> tuple[Path, float]:
    """The venv's python, and the seconds spent building it now (0.0 when it was cached)."""
    return ensure_venv(VENV_NAME, [PACKAGES], timeout)


def child_env() -> dict[str, str]:
    """Environment for a child python of the venv: the repository importable, no network."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONIOENCODING": "utf-8", "WANDB_DISABLED": "true"}
