"""Cached virtual environments for tests that run another project's code beside ours (verl pins
a transformers older than the one this project takes, so its code runs in a venv of its own).

`ensure_venv(name, installs)` creates ~/.cache/reasonrl_fast/NAME once (`python -m venv`, then
each pip install in order) and reuses it once its completion marker exists; a file lock keeps
two test processes from building it at the same time, and a half-built one from an interrupted
run is started over. Failing to build it raises `VenvError` with the reason: a comparison that
silently did not run would prove nothing."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path.home() / ".cache" / "reasonrl_fast"


class VenvError(RuntimeError):
    """A reference environment could not be built or run."""


def run(cmd: list[str], what: str, timeout: float) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise VenvError(f"{what}: no answer within {timeout:.0f} s ({' '.join(cmd)})") from None
    if proc.returncode != 0:
        raise VenvError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                        f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def ensure_venv(name: str, installs: list[list[str]], timeout: float) -> tuple[Path, float]:
    """The python of venv NAME (each entry of `installs` is the arguments of one
    `pip install --quiet ...`), and the seconds spent building it now (0.0 when cached)."""
    venv = ROOT / name
    python, marker, lock_path = venv / "bin" / "python", venv / ".complete", ROOT / f"{name}.lock"
    if marker.exists():
        return python, 0.0
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for it
        if marker.exists():
            return python, 0.0
        start = time.monotonic()
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", str(venv)], "creating the venv", timeout)
        for args in installs:
            run([str(python), "-m", "pip", "install", "--quiet", *args],
                f"installing {' '.join(args)} (needs the package registry)", timeout)
        marker.write_text("\n".join(" ".join(a) for a in installs) + "\n")
        return python, time.monotonic() - start
