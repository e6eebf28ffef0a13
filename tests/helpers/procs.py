"""The process tree as /proc shows it, for tests that look at (or kill) a run's processes."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager

# One home for the tree walk: the benchmarks measure a run's processes with it too.
from benchmarks.proc_tree import children, descendants  # noqa: F401


def alive(pid: int) -> bool:
    """Running, not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@contextmanager
def reaped(p: subprocess.Popen):
    """`p` killed and waited for on the way out if it is still running (a failed assertion or a
    timeout must not leave a run behind)."""
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def interrupt(p: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """Ctrl-C to `p` and its output once it has ended (within `timeout` s)."""
    p.send_signal(signal.SIGINT)
    return p.communicate(timeout=timeout)


def torchrun(script: str, world: int, args: list[str], cwd, timeout: float) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `tests/helpers/<script>` on `world` CPU ranks under
    torchrun (gloo on loopback, one thread a rank, SEED from the test's seed). In its own
    session, so that a hang ends with every rank killed, not only torchrun."""
    import sys

    import torch

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
               SEED=str(torch.initial_seed() % 2**31), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
                          "--standalone", os.path.join(root, "tests", "helpers", script), *args],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    finally:  # the ranks too, whether it ended or hung
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return p.returncode, out, err


class Watch:
    """Every process a running command starts, seen by polling its process tree."""

    def __init__(self, p: subprocess.Popen):
        self.p, self.seen, self._stop = p, set(), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set() and self.p.poll() is None:
            self.seen |= descendants(self.p.pid)
            time.sleep(0.2)

    def left_behind(self, grace_s: float = 15.0) -> list[int]:
        self._stop.set()
        self._t.join()
        deadline = time.monotonic() + grace_s
        while any(alive(p) for p in self.seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        return sorted(p for p in self.seen if alive(p))


def interrupt_once_training(p: subprocess.Popen, out, watch: Watch, timeout: float = 240) -> tuple[str, str]:
    """Wait (up to `timeout` s) for the run `p`, writing to the run directory `out`, to log its
    first step, check that it started its processes (Ray's and the workers', seen by `watch`),
    then Ctrl-C it: its output once it has ended."""
    from reasonrl_fast.util import read_metrics

    deadline = time.monotonic() + timeout
    while not ((out / "metrics.jsonl").exists() and read_metrics(out)) and time.monotonic() < deadline:
        assert p.poll() is None, p.communicate()[1][-3000:]
        time.sleep(0.3)
    assert len(watch.seen) > 3  # Ray's processes and the workers
    return interrupt(p, 90)
