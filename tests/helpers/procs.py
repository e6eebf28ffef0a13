"""The process tree as /proc shows it, for tests that look at (or kill) a run's processes."""

from __future__ import annotations

import os


def children() -> dict[int, list[int]]:
    """parent pid -> the pids of its children, for every process now alive (or a zombie)."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):  # gone meanwhile
                continue
            out.setdefault(ppid, []).append(int(name))
    return out


def alive(pid: int) -> bool:
    """Running, not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
