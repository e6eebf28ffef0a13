"""Ray side: start or join a cluster, place `nnodes x workers_per_node` worker actors through a
placement group, wire them into one torch.distributed group, and fan calls out to them."""

from __future__ import annotations

import os

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from transformers import AutoConfig

from reasonrl_fast.trainer.worker import Worker


def start_ray(cfg) -> bool:
    """Join `trainer.ray_address` / $RAY_ADDRESS, else start a local instance (no dashboard,
    bound to 127.0.0.1). Returns True when we started it (and so must shut it down)."""
    if ray.is_initialized():
        return False
    address = cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS", "")
    # Workers import reasonrl_fast from the same place as the driver.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
                        "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(cfg.trainer.cpus_per_worker)}}
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=True)
        return True
    world = cfg.trainer.nnodes * cfg.trainer.workers_per_node
    import torch

    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", runtime_env=env,
             num_cpus=max(os.cpu_count() or 1, world * cfg.trainer.cpus_per_worker),
             num_gpus=torch.cuda.device_count(), log_to_driver=True)
    return True


class WorkerError(RuntimeError):
    """A worker rank died or raised; the message names the rank."""


def gather(refs: list, what: str) -> list:
    """ray.get of one call per rank, in rank order, failing as soon as any rank fails. A plain
    ray.get on the list would wait for rank 0 first, and rank 0 may be blocked in a collective
    with the dead rank until the collective timeout runs out."""
    rank_of = {ref: r for r, ref in enumerate(refs)}
    out: list = [None] * len(refs)
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        r = rank_of[ready[0]]
        try:
            out[r] = ray.get(ready[0])
        except ray.exceptions.RayActorError as e:
            raise WorkerError(f"worker rank {r} died during {what}: {str(e).splitlines()[0]}") from e
        except ray.exceptions.RayTaskError as e:
            raise WorkerError(f"worker rank {r} failed during {what}: {getattr(e, 'cause', e)!r}") from e
    return out


class Cluster:
    def __init__(self, cfg, model_path: str):
        self.owns_ray = start_ray(cfg)
        t = cfg.trainer
        world = t.nnodes * t.workers_per_node
        gpu = bool(ray.cluster_resources().get("GPU", 0))
        bundle = {"GPU": 1, "CPU": 1} if gpu else {"CPU": t.cpus_per_worker}
        # nnodes > 1 with one worker per node: one bundle per node (STRICT_SPREAD).
        strategy = "PACK" if t.nnodes == 1 else ("STRICT_SPREAD" if t.workers_per_node == 1 else "SPREAD")
        self.pg = placement_group([dict(bundle) for _ in range(world)], strategy=strategy)
        ray.get(self.pg.ready(), timeout=300)
        remote = ray.remote(Worker)
        self.workers = [
            remote.options(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                           scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i)
                           ).remote(cfg, i, world, model_path)
            for i in range(world)]
        addr, port = ray.get(self.workers[0].address.remote())
        ray.get([w.setup.remote(addr, port) for w in self.workers])
        self.hf_config = AutoConfig.from_pretrained(model_path)
        self.world = world

    def call(self, method: str, *args):
        return gather([getattr(w, method).remote(*args) for w in self.workers], method)

    def _split(self, xs: list) -> list[list]:
        k = -(-len(xs) // self.world)
        return [xs[i * k:(i + 1) * k] for i in range(self.world)]

    def generate(self, prompts: list[list[int]], n: int, temperature: float, seed: int) -> list[list[int]]:
        """n samples per prompt (prompt-major), prompts split evenly over the workers."""
        shards = self._split(prompts)
        outs = gather([w.generate.remote(s, n, temperature, seed * 1000 + i)
                       for i, (w, s) in enumerate(zip(self.workers, shards))], "generate")
        return [r for o in outs for r in o]

    def train_step(self, prompts, responses, adv, step: int) -> dict:
        """Each worker trains on the samples it generated (same split as `generate`)."""
        ps, rs, advs = self._split(prompts), self._split(responses), self._split(adv)
        outs = gather([w.train_step.remote(p, r, a, step)
                       for w, p, r, a in zip(self.workers, ps, rs, advs)], "train_step")
        merged = {k: sum(o[k] for o in outs) / len(outs) for k in outs[0]}
        merged["memory/peak_gb"] = max(o["memory/peak_gb"] for o in outs)
        merged["train/skipped_updates"] = outs[0]["train/skipped_updates"]
        return merged

    def shutdown(self) -> None:
        # Best effort and bounded: after a failure a surviving rank may still be blocked in a
        # collective, and its shutdown call would queue behind that forever.
        ray.wait([w.shutdown.remote() for w in self.workers], num_returns=len(self.workers), timeout=10)
        for w in self.workers:
            ray.kill(w)
        remove_placement_group(self.pg)
        if self.owns_ray:
            ray.shutdown()
