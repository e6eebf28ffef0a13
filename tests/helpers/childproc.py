"""Run a snippet in a fresh Python process, so that a crash (SIGSEGV, heap corruption, abort)
fails one test with the signal's name instead of taking the whole test session down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Prepended to every snippet: the package from this checkout, and a helper that reports the
# exception a call raises (or "no exception") on stdout.
_PRELUDE = """
import torch
import reasonrl_fast.ops  # registers torch.ops.reasonrl_fast.*
ops = torch.ops.reasonrl_fast

def outcome(fn, *args, **kwargs):
    try:
        out = fn(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.is_cuda:
            torch.cuda.synchronize()
    except BaseException as e:  # noqa: BLE001 - we report whatever it is
        return type(e).__name__ + ": " + str(e).splitlines()[0]
    return "no exception"
"""


def run_snippet(code: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `code` (with the prelude above) in a child interpreter; never raises on its failure."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, full_env.get("PYTHONPATH")]))
    full_env.update(env or {})
    src = _PRELUDE + "\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)


def check_no_signal(p: subprocess.CompletedProcess) -> None:
    """Fail with the signal's name when the child died of a signal (rc < 0, or 128 + n)."""
    rc = p.returncode
    sig = -rc if rc < 0 else (rc - 128 if rc > 128 else 0)
    if sig:
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        raise AssertionError(f"child process died of {name}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    if rc != 0:
        raise AssertionError(f"child process exited with {rc}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")


def child_outcomes(code: str, timeout: float = 120, env: dict | None = None) -> list[str]:
    """Run `code`, which prints one `outcome(...)` per line; return those lines. The child must
    exit cleanly: a signal fails the caller's test."""
    p = run_snippet(code, timeout=timeout, env=env)
    check_no_signal(p)
    return p.stdout.strip().splitlines()
