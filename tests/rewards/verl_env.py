"""The reference trainer's own DAPO math scorer, run in a virtual environment of its own, so that
tests can compare `reasonrl_fast.rewards.math.dapo_score` with it case by case.

The environment is created once (`python -m venv` + `pip install --no-deps verl==0.9.1`) under
~/.cache/reasonrl_fast/venv-verl-0.9.1 and reused once its completion marker exists; a file lock
keeps two test processes from building it at the same time. Failing to build it (no package
registry) raises `VerlEnvError` with the reason: a comparison that silently did not run would
prove nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VERL_VERSION = "0.9.1"
VENV_DIR = Path.home() / ".cache" / "reasonrl_fast" / f"venv-verl-{VERL_VERSION}"
_MARKER = VENV_DIR / ".complete"
_LOCK = VENV_DIR.with_name(VENV_DIR.name + ".lock")

# Runs inside the venv. It loads math_dapo.py by file path instead of `import verl...`: importing
# any verl submodule runs verl/__init__.py first, which imports DataProto and with it torch,
# tensordict, numpy..., none of which a --no-deps install has (and which the scorer never uses;
# the module itself needs only `re` and `typing`).
_DRIVER = r"""
import importlib.util, json, os, sys, sysconfig
path = os.path.join(sysconfig.get_paths()["purelib"], "verl", "utils", "reward_score",
                    "math_dapo.py")
spec = importlib.util.spec_from_file_location("verl_math_dapo", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
out = []
for case in json.load(sys.stdin):
    try:
        out.append({"result": mod.compute_score(**case)})
    except Exception as e:  # a raise is a behaviour to compare too
        out.append({"error": type(e).__name__})
tables = {"SUBSTITUTIONS": mod.SUBSTITUTIONS, "REMOVED_EXPRESSIONS": mod.REMOVED_EXPRESSIONS}
json.dump({"results": out, "tables": tables}, sys.stdout)
"""


class VerlEnvError(RuntimeError):
    """The reference environment could not be built or run."""


def _python() -> Path:
    return VENV_DIR / "bin" / "python"


def _run(cmd: list[str], what: str, timeout: float) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise VerlEnvError(f"{what}: no answer within {timeout:.0f} s ({' '.join(cmd)})") from None
    if proc.returncode != 0:
        raise VerlEnvError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def ensure_verl_env(timeout: float = 600.0) -> tuple[Path, float]:
    """The venv's python, and the seconds spent building it now (0.0 when it was cached)."""
    if _MARKER.exists():
        return _python(), 0.0
    _LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for it
        if _MARKER.exists():
            return _python(), 0.0
        start = time.monotonic()
        shutil.rmtree(VENV_DIR, ignore_errors=True)  # a half-built one from an interrupted run
        _run([sys.executable, "-m", "venv", str(VENV_DIR)], "creating the venv", timeout)
        _run([str(_python()), "-m", "pip", "install", "--no-deps", "--quiet",
              f"verl=={VERL_VERSION}"],
             f"installing verl=={VERL_VERSION} (needs the package registry)", timeout)
        _MARKER.write_text(f"verl=={VERL_VERSION}\n")
        return _python(), time.monotonic() - start


def verl_dapo_scores(cases: list[dict], timeout: float = 300.0) -> tuple[list[dict], dict]:
    """verl's math_dapo.compute_score(**case) for each case, as {"result": dict} or
    {"error": exception type name}, computed in the venv's python (JSON in on stdin, out on
    stdout); and the module's normalisation tables (name -> list of entries)."""
    python, _ = ensure_verl_env()
    try:
        proc = subprocess.run([str(python), "-c", _DRIVER], input=json.dumps(cases),
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    except subprocess.TimeoutExpired:
        raise VerlEnvError(f"verl's scorer gave no answer within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise VerlEnvError(f"verl's scorer failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    answer = json.loads(proc.stdout)
    out = answer["results"]
    if len(out) != len(cases):
        raise VerlEnvError(f"verl's scorer answered {len(out)} of {len(cases)} cases")
    return out, answer["tables"]
