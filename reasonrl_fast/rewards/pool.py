"""Score a batch in parallel, with a time limit per sample that really ends the work.

Each worker is a process (backend "process", the default) or a Ray actor (backend "ray", for a
cluster). A sample that runs past `timeout_s` gets its worker killed and replaced, not waited
on; it scores 0 and is counted (`reward/timeouts`). A scorer that raises, or whose worker dies,
scores 0 and is counted too (`reward/errors`). Results come back in the order of the samples.

    with RewardPool(num_workers=4, timeout_s=30) as pool:
        results, metrics = pool.score([(data_source, response, ground_truth, extra_info), ...])

The machinery is `WorkerPool`'s, which runs any runner's jobs so (the rollout's tool calls too,
tools/box.py); `RewardPool` is it scoring samples.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterable
from multiprocessing.connection import Connection, wait

from reasonrl_fast.rewards.score import load_reward_fn, routes
from reasonrl_fast.util import quantile

Sample = tuple  # (data_source, solution_str, ground_truth, extra_info)
FAILED = {"score": 0.0, "acc": False}
_MAX_CHUNK = 32


class PoolError(RuntimeError):
    """A pool cannot run its jobs at all: its workers fail to start."""


class RewardPoolError(PoolError):
    """The reward pool cannot score at all: its workers fail to start."""


class WorkerPool:
    """Jobs run by worker processes (or Ray actors), each job with a time limit that really ends
    it: a job that runs past `timeout_s` gets its worker killed and replaced. `config` goes to
    every worker, whose runner (config["runner"], "module:Class"; the reward `Scorer` when
    absent, rewards/worker.py) it builds once and asks `run(job)` of each job. The reward pool is
    one; the rollout's tool calls are another (tools/box.py)."""

    what = "worker"
    """How errors name one of its workers ("reward worker")."""
    Error = PoolError
    timeout_setting = "timeout_s"
    """How a timeout's message names the time limit."""

    def __init__(self, config: dict, num_workers: int, timeout_s: float, backend: str = "process",
                 start_timeout_s: float = 120.0):
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self._backend = _RayBackend(config) if backend == "ray" else _ProcessBackend(config)
        self._slots = [self._backend.start() for _ in range(num_workers)]
        self._starting = {id(s): time.monotonic() for s in self._slots}
        self.last_error = ""

    def run(self, jobs: list) -> tuple[list[tuple[str, object, float]], dict]:
        """Each job's (status, value, seconds), in order: ("ok", the runner's value), ("error",
        why: it raised, or its worker died) or ("timeout", why); and the counts {"timeouts",
        "errors"}. The seconds run from when the job's worker took it up."""
        n = len(jobs)
        results: list[tuple | None] = [None] * n
        todo = deque(range(n))
        # id(slot) -> [slot, indices sent and not yet answered, start of the first of them]
        busy: dict[int, list] = {}
        idle = [s for s in self._slots if id(s) not in self._starting]
        count = {"timeouts": 0, "errors": 0}

        def fail(i: int, kind: str, t0: float, why: str) -> None:
            results[i] = ("timeout" if kind == "timeouts" else "error", why, time.monotonic() - t0)
            count[kind] += 1
            self.last_error = why

        # Jobs go out in chunks, two per worker for a small batch: each message wakes a worker,
        # so one per job made a 128-sample step cost far more than scoring in the driver
        # (benchmarks/RESULTS.md §4). Each job keeps its own clock: it starts when the previous
        # one in its chunk answers.
        size = max(1, min(_MAX_CHUNK, math.ceil(n / (2 * len(self._slots)))))
        while todo or busy:
            while todo and idle:
                chunk = [todo.popleft() for _ in range(min(size, len(todo)))]
                slot = idle.pop()
                self._backend.submit(slot, [(i, jobs[i]) for i in chunk])
                busy[id(slot)] = [slot, deque(chunk), time.monotonic()]
            now = time.monotonic()
            deadline = min([b[2] + self.timeout_s for b in busy.values()] +
                           [t + self.start_timeout_s for t in self._starting.values()])
            waiting = [b[0] for b in busy.values()] + [s for s in self._slots if id(s) in self._starting]
            for slot, kind, payload in self._backend.wait(waiting, max(0.0, deadline - now)):
                if kind == "ready":
                    self._starting.pop(id(slot), None)
                    idle.append(slot)
                elif kind == "result":
                    entry = busy[id(slot)]
                    seq, status, value, _ = payload
                    i = entry[1].popleft()
                    assert seq == i, (seq, i)
                    if status == "ok":
                        results[i] = ("ok", value, time.monotonic() - entry[2])
                    else:
                        fail(i, "errors", entry[2], value)
                    entry[2] = time.monotonic()
                    if not entry[1]:
                        busy.pop(id(slot))
                        idle.append(slot)
                else:  # "fatal" (could not start) or "died" (killed by its job, out of memory)
                    if id(slot) in busy:
                        _, chunk, t0 = busy.pop(id(slot))
                        fail(chunk.popleft(), "errors", t0, f"{self.what} died while running a job ({payload})")
                        todo.extendleft(reversed(chunk))
                    elif kind == "fatal" or id(slot) in self._starting:
                        self.close()
                        raise self.Error(f"a {self.what} failed to start: {payload}")
                    self._replace(slot)
            now = time.monotonic()
            for slot, chunk, t0 in list(busy.values()):
                if now - t0 >= self.timeout_s:  # hung: kill it, the job fails
                    busy.pop(id(slot))
                    fail(chunk.popleft(), "timeouts", t0, f"a job ran past {self.timeout_setting}={self.timeout_s}")
                    todo.extendleft(reversed(chunk))
                    self._replace(slot)
            for slot in self._slots:
                if id(slot) in self._starting and now - self._starting[id(slot)] > self.start_timeout_s:
                    self.close()
                    raise self.Error(f"a {self.what} did not start within {self.start_timeout_s:.0f} s")
        return results, count

    def _replace(self, slot) -> None:
        self._backend.kill(slot)
        new = self._backend.start()
        self._slots[self._slots.index(slot)] = new
        self._starting[id(new)] = time.monotonic()

    def close(self) -> None:
        for slot in self._slots:
            self._backend.kill(slot)
        self._slots, self._starting = [], {}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RewardPool(WorkerPool):
    what, Error, timeout_setting = "reward worker", RewardPoolError, "reward.timeout_s"

    def __init__(self, reward_fn: str = "", num_workers: int = 2, timeout_s: float = 30.0,
                 backend: str = "process", sandbox_timeout_s: float = 10.0,
                 start_timeout_s: float = 120.0, kinds: Iterable[str] | None = None):
        if num_workers < 1:
            raise ValueError(f"reward.num_workers={num_workers!r}: must be >= 1")
        if not timeout_s > 0:
            raise ValueError(f"reward.timeout_s={timeout_s!r}: must be > 0")
        if backend not in ("process", "ray"):
            raise ValueError(f"reward.backend={backend!r}: must be 'process' or 'ray'")
        if reward_fn:
            load_reward_fn(reward_fn)  # a bad spec fails here, named, not in every worker
        # the embedded tasks' routes as this process knows them: the workers import no task
        # `kinds`: the scorer kinds the samples need (rewards/score.py `scorer_kinds`), which each
        # worker imports before its first sample; None: every kind
        config = {"reward_fn": reward_fn, "sandbox_timeout_s": sandbox_timeout_s, "routes": routes(),
                  "kinds": None if kinds is None else sorted(kinds)}
        super().__init__(config, num_workers, timeout_s, backend, start_timeout_s)
        self.last_latencies: list[float] = []

    def score(self, samples: list[Sample]) -> tuple[list[dict], dict]:
        """({"score", "acc"} per sample, in order: FAILED where its scorer raised, its worker
        died or it ran past reward.timeout_s; the step's metrics)."""
        results, count = self.run([tuple(s) for s in samples])
        latency = [seconds for _, _, seconds in results]
        self.last_latencies = latency  # per sample, for callers that merge several calls' metrics
        return ([value if status == "ok" else dict(FAILED) for status, value, _ in results],
                {"reward/timeouts": count["timeouts"], "reward/errors": count["errors"],
                 "reward/latency_p50_s": quantile(latency, 0.5), "reward/latency_p99_s": quantile(latency, 0.99)})


class _Proc:
    """A worker process and the two pipe ends the pool holds."""

    def __init__(self, proc: subprocess.Popen, inbox: Connection, outbox: Connection):
        self.proc, self.inbox, self.outbox = proc, inbox, outbox


class _ProcessBackend:
    def __init__(self, config: dict):
        self.config = config

    def start(self) -> _Proc:
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        # The worker sees the pool's sys.path, so a `module:function` reward importable here
        # (from the working directory, a test folder) is importable there too.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
        # Its own session: the kill takes what the scorer started too (a user's subprocess).
        proc = subprocess.Popen(
            [sys.executable, "-m", "reasonrl_fast.rewards.worker", str(to_worker_r), str(from_worker_w),
             str(os.getpid())], pass_fds=(to_worker_r, from_worker_w), stdin=subprocess.DEVNULL,
            env=env, start_new_session=True)
        os.close(to_worker_r)
        os.close(from_worker_w)
        slot = _Proc(proc, Connection(from_worker_r, writable=False), Connection(to_worker_w, readable=False))
        slot.outbox.send(self.config)
        return slot

    def submit(self, slot: _Proc, chunk: list[tuple[int, Sample]]) -> None:
        try:
            slot.outbox.send(chunk)
        except (BrokenPipeError, OSError):  # died while idle: wait() reports it
            pass

    def wait(self, slots: list[_Proc], timeout: float) -> list[tuple]:
        by_conn = {s.inbox: s for s in slots}
        events = []
        for conn in wait(list(by_conn), timeout):
            slot = by_conn[conn]
            try:
                # everything already waiting on this pipe: one wait() per burst, not per sample
                while True:
                    kind, payload = conn.recv()
                    events.append((slot, kind, payload))
                    if not conn.poll():
                        break
            except (EOFError, OSError):
                code = slot.proc.wait()
                events.append((slot, "died", f"exit status {code}"))
        return events

    def kill(self, slot: _Proc) -> None:
        try:
            os.killpg(slot.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        slot.proc.wait()
        slot.inbox.close()
        slot.outbox.close()


class _RayBackend:
    """Workers as Ray actors, spread over the cluster's nodes. They ask for no CPU slot: the
    trainer's FSDP workers hold the slots, and scoring is short work beside them. A chunk goes
    as one call per sample (an actor runs its calls in order), so each sample is timed alone."""

    def __init__(self, config: dict):
        import ray

        from reasonrl_fast.rewards.worker import Scorer

        if not ray.is_initialized():
            raise RewardPoolError("reward.backend=ray needs a running Ray instance (ray.init() first)")
        self.ray, self.config = ray, config
        self.actor_cls = ray.remote(num_cpus=0, max_restarts=0, scheduling_strategy="SPREAD")(Scorer)
        self.pending: dict[int, deque] = {}  # id(actor) -> deque of (ObjectRef, seq or None for ready)

    def start(self):
        actor = self.actor_cls.remote(self.config)
        self.pending[id(actor)] = deque([(actor.ready.remote(), None)])
        return actor

    def submit(self, actor, chunk: list[tuple[int, Sample]]) -> None:
        self.pending[id(actor)].extend((actor.run.remote(sample), seq) for seq, sample in chunk)

    def wait(self, actors: list, timeout: float) -> list[tuple]:
        heads = {self.pending[id(a)][0][0]: a for a in actors if self.pending[id(a)]}
        done, _ = self.ray.wait(list(heads), num_returns=1, timeout=timeout)
        if done:  # take every other finished one too, without waiting
            done, _ = self.ray.wait(list(heads), num_returns=len(heads), timeout=0)
        events = []
        for ref in done:
            actor = heads[ref]
            _, seq = self.pending[id(actor)].popleft()
            try:
                value = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as e:
                self.pending[id(actor)].clear()
                events.append((actor, "fatal" if seq is None else "died", str(e).splitlines()[0]))
                continue
            events.append((actor, "ready", None) if seq is None else (actor, "result", (seq, *value)))
        return events

    def kill(self, actor) -> None:
        self.pending.pop(id(actor), None)
        self.ray.kill(actor, no_restart=True)
