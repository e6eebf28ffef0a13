"""One pool worker: runs the jobs the pool sends, one at a time, until the pool closes the pipe.
Run as `python -m reasonrl_fast.rewards.worker READ_FD WRITE_FD PARENT_PID` by pool.py; the Ray
backend uses `Scorer` inside an actor. Its runner is the reward `Scorer` (a job: a sample to
score), or the "module:Class" of the pool's config["runner"] (tools/box.py `Caller`: a tool call),
built from the config and asked `run(job)` -> (status, value, seconds).

A worker is a whole process so that the pool can end a hung scorer for real: a thread stuck
in math-verify's parser or in a user's `while True` cannot be stopped, a process can be killed.
"""

from __future__ import annotations

import ctypes
import os
import pkgutil
import signal
import sys
import time
from functools import partial
from multiprocessing.connection import Connection

from reasonrl_fast.rewards.score import (SCORERS, add_routes, call_reward_fn, default_compute_score, import_scorers,
                                         load_reward_fn, takes_two_args)


class Scorer:
    """The reward function of one pool, loaded once per worker. `config`: {"reward_fn": spec
    ('' for the routing by data_source), "sandbox_timeout_s": float, "routes": the embedded
    tasks' data_source -> scorer, as the pool's process knows them (rewards/score.py `routes`),
    "kinds": the scorer kinds the pool's samples need (None: every one)}."""

    def __init__(self, config: dict):
        spec = config.get("reward_fn", "")
        if spec:
            self.fn = load_reward_fn(spec)
        else:
            self.fn = partial(default_compute_score, sandbox_timeout_s=config["sandbox_timeout_s"])
            own = config.get("routes") or {}
            add_routes(own)
            # Import the scorers now, not inside the first sample's time limit (a kind not named
            # still scores: its first sample imports it)
            kinds = config.get("kinds")
            import_scorers(list(SCORERS) + sorted(set(own.values())) if kinds is None else kinds)
        self.two_args = takes_two_args(self.fn)

    def run(self, sample: tuple) -> tuple[str, object, float]:
        """('ok', {"score", "acc"}, seconds) or ('error', message, seconds); never raises."""
        t = time.perf_counter()
        try:
            out = call_reward_fn(self.fn, self.two_args, *sample)
            return "ok", out, time.perf_counter() - t
        except BaseException as e:  # noqa: BLE001 - sys.exit() in a reward function is an error too
            return "error", f"{type(e).__name__}: {e}"[:1000], time.perf_counter() - t

    def ready(self) -> bool:
        return True


def _die_with(parent: int) -> None:
    """Exit when the pool's process dies, even mid-sample: the kernel sends SIGKILL
    (PR_SET_PDEATHSIG) as soon as the parent is gone, so no orphan keeps scoring. (Strictly,
    when the parent *thread* that started it ends: create a pool from a thread that outlives it.)"""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the closed pipe still ends the loop
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(0)


def main(argv: list[str]) -> None:
    read_fd, write_fd, parent = (int(a) for a in argv)
    _die_with(parent)
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        config = inbox.recv()
        runner = (pkgutil.resolve_name(config["runner"]) if config.get("runner") else Scorer)(config)
    except BaseException as e:  # noqa: BLE001 - reported to the pool, which names it
        outbox.send(("fatal", f"{type(e).__name__}: {e}"))
        return
    outbox.send(("ready", None))
    while True:
        try:
            chunk = inbox.recv()
        except EOFError:  # the pool closed: done
            return
        for seq, job in chunk:  # one answer per job: the pool times each one
            outbox.send(("result", (seq, *runner.run(job))))


if __name__ == "__main__":
    main(sys.argv[1:])
