"""verl 0.9.1's own DAPO math scorer, run in a virtual environment of its own, so that
tests can compare `reasonrl_fast.rewards.math.dapo_score` with it case by case.

The environment is created once (`python -m venv` + `pip install --no-deps verl==0.9.1`) under
~/.cache/reasonrl_fast/venv-verl-0.9.1 and reused once its completion marker exists; a file lock
keeps two test processes from building it at the same time. Failing to build it (no package
registry) raises `VerlEnvError` with the reason: a comparison that silently did not run would
prove nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.venvs import ROOT as VENVS
from tests.venvs import VenvError, ensure_venv

VERL_VERSION = "0.9.1"
VENV_DIR = VENVS / f"venv-verl-{VERL_VERSION}"

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


VerlEnvError = VenvError


def ensure_verl_env(timeout: float = 600.0) -> tuple[Path, float]:
    """The venv's python, and the seconds spent building it now (0.0 when it was cached)."""
    return ensure_venv(VENV_DIR.name, [["--no-deps", f"verl=={VERL_VERSION}"]], timeout)


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
