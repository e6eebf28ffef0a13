"""The run's tools, called so that no call can stall or crash the rollout: each call runs in a
worker process of the box's pool (rewards/pool.py `WorkerPool`, the reward pool's machinery), with
a time limit that kills and replaces the worker (`rollout.tool_timeout_s`), an address-space
limit, and its text cut to `max_chars`. Whatever goes wrong (an unknown tool, arguments that do
not fit, an exception, a hang, a crash) comes back as an error `Observation` the policy sees,
and is counted.

    with ToolBox(["calculator", "python"], timeout_s=10) as box:
        observations, metrics = box.call([("calculator", {"expression": "37*48"}), ...])
"""

from __future__ import annotations

import pkgutil
import resource
import time

from reasonrl_fast.rewards.pool import PoolError, WorkerPool
from reasonrl_fast.tools.base import Observation, first_parameter, load_tool, tool_path, tool_schema
from reasonrl_fast.util import meminfo_bytes

CUT = "\n[... {} more characters]"


class ToolPoolError(PoolError):
    """The tool box's workers fail to start."""


class Caller:
    """A tool worker's runner (rewards/worker.py): the box's tools, imported once; a job is
    (module:function path, keyword arguments)."""

    def __init__(self, config: dict):
        self.max_chars = config["max_chars"]
        self.tools = {path: pkgutil.resolve_name(path) for path in config["paths"]}  # checked by the box
        if config.get("memory_mb"):  # what the calls may add to what loading the tools took
            cap = meminfo_bytes("VmSize", "/proc/self/status") + config["memory_mb"] * 2 ** 20
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    def run(self, job: tuple) -> tuple[str, object, float]:
        t = time.perf_counter()
        path, kwargs = job
        try:
            out = self.tools[path](**kwargs)
            return "ok", _cut(out if isinstance(out, str) else str(out), self.max_chars), time.perf_counter() - t
        except BaseException as e:  # noqa: BLE001 - sys.exit() in a tool is its failure too
            return "error", _cut(f"{type(e).__name__}: {e}", self.max_chars), time.perf_counter() - t


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + CUT.format(len(text) - n)


class ToolBox(WorkerPool):
    """`specs`: the `rollout.tools` entries (registered names or "module:function" paths), each
    checked here (a ConfigError names a bad one). `timeout_s`: one call's limit; `max_chars`: the
    longest observation; `memory_mb`: each worker's address space (None: unlimited).
    `schemas`: the tools' OpenAI function schemas, in order (what a chat template is given)."""

    what, Error, timeout_setting = "tool worker", ToolPoolError, "rollout.tool_timeout_s"

    def __init__(self, specs: list[str], num_workers: int = 1, timeout_s: float = 10.0, max_chars: int = 2000,
                 memory_mb: int | None = 2048, start_timeout_s: float = 120.0):
        if not timeout_s > 0:
            raise ValueError(f"rollout.tool_timeout_s={timeout_s!r}: must be > 0")
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r}: must be >= 1")
        self.paths, self.schemas = {}, []
        for spec in specs:
            fn = load_tool(spec)
            if fn.__name__ in self.paths:
                raise ValueError(f"rollout.tools: two tools are called {fn.__name__!r}")
            self.paths[fn.__name__] = tool_path(spec)
            self.schemas.append(tool_schema(fn, spec))
        self._first = {s["function"]["name"]: first_parameter(s) for s in self.schemas}
        self.max_chars = max_chars
        super().__init__({"runner": "reasonrl_fast.tools.box:Caller", "paths": list(self.paths.values()),
                          "max_chars": max_chars, "memory_mb": memory_mb},
                         num_workers, timeout_s, "process", start_timeout_s)

    @property
    def names(self) -> list[str]:
        return list(self.paths)

    def call(self, calls: list[tuple[str, dict | str]]) -> tuple[list[Observation], dict]:
        """One observation per call (name, arguments), in order, and the metrics of the batch:
        tool/calls, tool/errors, tool/timeouts, tool/seconds (their wall times summed). Arguments
        are a dict of keyword arguments, or one string for the tool's first argument (the plain
        form)."""
        obs: list[Observation | None] = [None] * len(calls)
        jobs, where = [], []
        for i, (name, args) in enumerate(calls):
            problem = self._problem(name, args)
            if problem:
                obs[i] = Observation(problem, "error")
                continue
            if isinstance(args, str):
                args = {self._first[name]: args}
            jobs.append((self.paths[name], args))
            where.append(i)
        results, _ = self.run(jobs) if jobs else ([], {})
        for i, (status, value, seconds) in zip(where, results):
            obs[i] = Observation(value if status == "ok" else _cut(f"error: {value}", self.max_chars), status, seconds)
        done = [o for o in obs if o is not None]
        return done, {"tool/calls": len(calls), "tool/errors": sum(o.status == "error" for o in done),
                      "tool/timeouts": sum(o.status == "timeout" for o in done),
                      "tool/seconds": sum(o.seconds for o in done)}

    def _problem(self, name, args) -> str | None:
        """Why a call cannot be made, as the policy is told; None when it can."""
        if name not in self.paths:
            return f"error: no tool is called {str(name)[:80]!r}; the tools are {', '.join(self.paths)}"
        if isinstance(args, str):
            return None if self._first[name] else f"error: {name} takes no argument"
        if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
            return f"error: the arguments of {name} must be a JSON object, got {type(args).__name__}"
        return None
