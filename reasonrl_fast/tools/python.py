"""The `python` tool: a code interpreter. Each call runs its program in a fresh process of the
code reward's sandbox (rewards/code.py `run_program`: no network, no files of the host beyond the
interpreter's, a time, memory, process and output limit, seccomp), so nothing carries over from
one call to the next: a program that needs an earlier result computes it again. A fresh process
per call costs a sandbox start (RESULTS §4) and keeps one sample's calls from reading another's."""

from __future__ import annotations

TIMEOUT_S = 5.0
"""Seconds one program may run (the tool box's own limit, rollout.tool_timeout_s, must be
longer)."""
KEEP = 4096
"""Bytes of a program's output kept (the tool box cuts its observation shorter still)."""


def python(code: str) -> str:
    """
    Run a Python 3 program in a sandbox and return what it prints. Nothing is kept between calls; there is no network and no file of the host.

    Args:
        code: The program, whose results are printed with print().
    """
    from reasonrl_fast.rewards.code import run_program

    if not isinstance(code, str):
        raise TypeError(f"code must be text, got {type(code).__name__}")
    r = run_program(code, timeout_s=TIMEOUT_S, keep=KEEP)
    if r.status == "ok":
        return r.stdout
    if r.status == "timeout":
        raise TimeoutError(f"the program ran past {TIMEOUT_S:g} s")
    if r.status == "output_limit":
        raise RuntimeError(f"the program printed too much; its first lines:\n{r.stdout[:500]}")
    if r.status == "sandbox_error":
        raise RuntimeError("the sandbox could not run the program")
    # the error's last lines, as an interpreter shows them
    tail = "\n".join(r.stderr_tail.strip().splitlines()[-6:])
    raise RuntimeError((r.stdout + tail).strip() or "the program failed")
