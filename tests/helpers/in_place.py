"""The trainer's cluster without Ray: real `Worker`s (without process group or model) whose
engine the test gives, behind handles whose `.method.remote(...)` runs the method at once, fanned
out by the real `Cluster` and `WorkerGroup` (tests of the loop's sampling and scoring)."""

import threading

from reasonrl_fast.rollout import group as group_mod
from reasonrl_fast.rollout.handoff import Handoff
from reasonrl_fast.rollout.registry import EngineSpec
from reasonrl_fast.rollout.group import WorkerGroup
from reasonrl_fast.trainer.cluster import Cluster
from reasonrl_fast.trainer.worker import Worker


class InPlace:
    """A Ray actor handle whose `.method.remote(...)` runs the worker's method at once."""

    def __init__(self, worker):
        self._w = worker

    def __getattr__(self, name):
        return type("Method", (), {"remote": staticmethod(getattr(self._w, name))})()


def in_place_cluster(cfg, make_engine, monkeypatch, world: int = 2) -> tuple[Cluster, list]:
    """A colocated `Cluster` of `world` in-place workers, each with the engine `make_engine()`
    returns; the engines, in rank order. Ray's `as_completed` yields the calls in order."""
    engines, handles = [], []
    for rank in range(world):
        w = Worker.__new__(Worker)
        w.cfg, w.rank, w.world, w._samples = cfg, rank, world, None
        w.spec, w.handoff, w._idle_lock = EngineSpec(), Handoff(), threading.Lock()
        w.engine = make_engine()
        engines.append(w.engine)
        handles.append(InPlace(w))
    group = WorkerGroup.__new__(WorkerGroup)
    group.cfg, group.spec, group.count, group.tp, group.log_dir, group.actors = (
        cfg, None, world, cfg.rollout.tensor_parallel_size, None, handles)
    c = Cluster.__new__(Cluster)
    c.cfg, c.world, c.workers, c.group, c._kept, c._pending, c.version = cfg, world, handles, group, None, None, 0
    monkeypatch.setattr(group_mod, "as_completed", lambda refs, what, ranks=None, role="worker": enumerate(refs))
    return c, engines
