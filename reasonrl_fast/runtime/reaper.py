"""End every process of a local Ray instance when the driver ends, however it ends.

Ray ties its GCS and raylet to the driver, but other processes (the dashboard and runtime-env
agents, a worker busy in native code) only notice much later, or not at all, after a `kill -9` of
the driver. So the driver tags its environment before `ray.init` (every Ray process inherits
the tag) and starts this file as a small watchdog. Once a second the watchdog notes the
driver's descendants; it waits on a pipe from the driver: end of file means the driver is gone
(the kernel closes the pipe whatever killed it), and the watchdog then kills every process it
noted or that carries the tag. Standard library only, so that it starts in milliseconds.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid

TAG_VAR = "REASONRL_RUN_TAG"


def start() -> subprocess.Popen:
    """Tag this process's environment (inherited by everything it starts from now on) and start
    the watchdog. Keep the returned handle; close its stdin after ray.shutdown() (a clean
    exit leaves Ray's processes to Ray)."""
    tag = uuid.uuid4().hex
    os.environ[TAG_VAR] = tag
    # stdin=PIPE: our end is close-on-exec, so Ray's processes do not hold it open.
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), tag, str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)


def _scan() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every live process (zombies are already dead)."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if fields[0] != "Z":
                out[int(name)] = (int(fields[1]), fields[19])
    return out


def _has_tag(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


class Watch:
    """The run's processes: the driver's descendants, remembered by (pid, start time) so that
    they are still found once re-parented, plus any live process that carries the tag (one
    started since the last look). Ray renames its agents with setproctitle, which can overwrite
    the environment /proc shows, so the tag alone would miss them."""

    def __init__(self, tag: str, driver: int):
        self.needle, self.known = f"{TAG_VAR}={tag}".encode(), {}
        self.exclude = {os.getpid(), driver}
        self.roots = {driver}

    def look(self) -> list[int]:
        procs = _scan()
        self.known = {p: t for p, t in self.known.items() if procs.get(p, (0, None))[1] == t}
        grew = True
        while grew:  # descendants of the driver or of a process we know
            grew = False
            for pid, (ppid, start) in procs.items():
                if pid not in self.known and (ppid in self.roots or ppid in self.known):
                    self.known[pid], grew = start, True
        for pid, (_, start) in procs.items():
            if pid not in self.known and _has_tag(pid, self.needle):
                self.known[pid] = start
        return [p for p in self.known if p not in self.exclude]


def sweep(watch: Watch, deadline_s: float = 30.0) -> None:
    """SIGKILL the run's processes until none is left (a dying raylet may still start one)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        pids = watch.look()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)


def _main(tag: str, driver: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the driver; we follow it
    watch = Watch(tag, driver)
    while not select.select([sys.stdin], [], [], 1.0)[0]:  # readable only at end of file
        watch.look()
    if driver not in _scan():  # else the driver closed the pipe after its own ray.shutdown()
        sweep(watch)


if __name__ == "__main__":
    _main(sys.argv[1], int(sys.argv[2]))
