"""Rollout workers (rollout/worker.py, the trainer's workers among them) as a group of Ray actors:
placed through a placement group, one bundle each, wired into one process group through rank
0's rendezvous, and called together, a worker's failure reported with what its engine adds (its
log's last line). The trainer's cluster (trainer/cluster.py) and the eval command
(eval/generate.py) both start their workers here.

The engines of a group: with rollout.tensor_parallel_size TP, each TP consecutive workers run one
engine (`engine_ranks`), every rank of it sent the same prompts; `shares` is the one rule that
splits a call's prompts over the engines (util.py `engine_shares`)."""

from __future__ import annotations

from contextlib import contextmanager

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from reasonrl_fast.runtime import ray_cluster as rt
from reasonrl_fast.runtime.ray_cluster import WorkerError, as_completed, gather, place_workers
from reasonrl_fast.util import engine_shares

SHUTDOWN_TIMEOUT_S = 10.0
"""How long the workers' shutdown calls may take before they are killed: after a failure a
surviving rank may still be blocked in a collective, and its shutdown call would queue behind
that forever."""


def cluster_gpus() -> int:
    """The GPUs of the Ray cluster in use."""
    return int(ray.cluster_resources().get("GPU", 0))


def worker_bundle(gpus: int, cpus: int) -> dict:
    """What one worker holds: a GPU (and a CPU slot) where the cluster has GPUs, else `cpus` CPU
    slots (its role's: trainer.cpus_per_worker, or `rollout_cpus` for a rollout worker)."""
    return {"GPU": 1, "CPU": 1} if gpus else {"CPU": cpus}


class WorkerGroup:
    """`count` actors of `cls` (a RolloutWorker class), rank i built as `cls(cfg, i, count,
    model_path, spec, **kwargs)` in bundle i of a placement group of `bundle`s over `nodes` nodes
    (runtime/ray_cluster.py `place_workers`: default trainer.nnodes; 1 packs them on as few
    nodes as hold them). `log_dir`: the run directory the workers' engines write their logs under
    (`EngineSpec.log_path`, given to each worker), which a failure's note reads; None where they
    write none. `role`: how a failure names the group's workers. `concurrency_groups`: Ray's, for
    actors whose methods run in threads of their own (the rollout workers' weight loads beside
    their generation)."""

    role = "worker"

    def __init__(self, cls, cfg, model_path: str, spec, count: int, bundle: dict, *, log_dir: str | None = None,
                 nodes: int | None = None, tp: int | None = None, role: str = "worker",
                 concurrency_groups: dict | None = None, **kwargs):
        self.cfg, self.spec, self.count, self.log_dir, self.role = cfg, spec, count, log_dir, role
        self.tp = tp or cfg.rollout.tensor_parallel_size  # 1: a group of trainer workers without engines
        self.pg = place_workers(cfg.trainer, bundle, local=rt.is_local(), world=count, nodes=nodes)
        remote = ray.remote(concurrency_groups=concurrency_groups)(cls) if concurrency_groups else ray.remote(cls)
        self.actors = [
            remote.options(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                           scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i)
                           ).remote(cfg, i, count, model_path, spec, log_dir=log_dir, **kwargs)
            for i in range(count)]

    def setup(self, what: str = "setup") -> list:
        """Every worker's `setup`, given rank 0's rendezvous address. Through `gather`
        (runtime/ray_cluster.py), which raises a worker's UserError as itself: a model directory
        without weights, a setting only the device can judge, a model the engine cannot load."""
        addr, port = gather([self.actors[0].address.remote()], "startup")[0]
        return self.gather([a.setup.remote(addr, port) for a in self.actors], what)

    @contextmanager
    def engine_notes(self):
        """A worker's failure, with what its engine adds (`EngineSpec.error_note`: the engine
        log's last line) when it has something."""
        try:
            yield
        except WorkerError as e:
            note = (self.spec.error_note(self.log_dir, e.rank) if self.log_dir and e.rank is not None else None)
            if not note:
                raise
            raise WorkerError(f"{e}; {note}", rank=e.rank, died=e.died) from e

    def as_completed(self, refs: list, what: str, ranks: list[int] | None = None):
        """runtime/ray_cluster.py `as_completed`, failures with the engine's note."""
        with self.engine_notes():
            yield from as_completed(refs, what, ranks, self.role)

    def gather(self, refs: list, what: str, ranks: list[int] | None = None) -> list:
        """runtime/ray_cluster.py `gather`, failures with the engine's note."""
        with self.engine_notes():
            return gather(refs, what, ranks, self.role)

    def call(self, method: str, *args) -> list:
        """`method(*args)` on every worker, their results in rank order."""
        return self.gather([getattr(a, method).remote(*args) for a in self.actors], method)

    def engine_ranks(self, engine: int) -> range:
        """The ranks of engine `engine`: TP consecutive workers."""
        return range(engine * self.tp, (engine + 1) * self.tp)

    def shares(self, count: int) -> list[tuple[range, range]]:
        """Each worker's (its engine's items, its own items) of `count` items (util.py
        `engine_shares`)."""
        return engine_shares(count, self.count, self.tp)

    @staticmethod
    def gather_all(calls: list[tuple[WorkerGroup, list]], what: str) -> list[list]:
        """One call per worker of several groups (each group with its refs in rank order), waited
        on together: a failure in any group ends the wait at once (a rank blocked in a collective
        with a dead one of the other group would wait out the collective's timeout), named by its
        group's role and rank, with its engine's note. The results, per group in rank order."""
        where = {ref: (g, rank) for g, (_, refs) in enumerate(calls) for rank, ref in enumerate(refs)}
        out = [[None] * len(refs) for _, refs in calls]
        pending = list(where)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            g, rank = where[ready[0]]
            try:
                out[g][rank] = calls[g][0].gather(ready, what, [rank])[0]
            except WorkerError as e:
                # a live rank's collective failed: a worker of either group that died is the cause
                dead = None if e.died else rt.dead_call(pending)
                if dead is None:
                    raise
                h, dead_rank = where[dead[0]]
                with calls[h][0].engine_notes():
                    raise rt.died(dead_rank, what, calls[h][0].role, dead[1]) from e
        return out

    def shutdown(self) -> None:
        """Best effort and bounded (SHUTDOWN_TIMEOUT_S): each worker's engine and process group,
        then the actors and their placement group."""
        ray.wait([a.shutdown.remote() for a in self.actors], num_returns=len(self.actors), timeout=SHUTDOWN_TIMEOUT_S)
        for a in self.actors:
            ray.kill(a)
        remove_placement_group(self.pg)
