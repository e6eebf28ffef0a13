"""The process tree as /proc shows it: a run's processes for the benchmarks that measure them, and
for the tests that look at (or kill) them, which import these from here. No imports beyond os."""

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


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (children, their children, ...), not `pid` itself."""
    kids, todo, found = children(), [pid], set()
    while todo:
        for k in kids.get(todo.pop(), []):
            found.add(k)
            todo.append(k)
    return found
