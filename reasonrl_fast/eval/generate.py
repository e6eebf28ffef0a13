"""Sampling for the eval command on Ray: a group of rollout workers (rollout/worker.py
`RolloutWorker`, started by rollout/group.py `WorkerGroup`, as the trainer's are), one per GPU of
the cluster when there are GPUs, else `trainer.nnodes x trainer.workers_per_node` CPU workers of
`trainer.cpus_per_worker` slots. Each worker loads the model once; prompts go out in fixed
batches, and sample i of the run is drawn with `sample_seed(eval.seed, 0, i)`, so the samples
depend neither on how many workers there are nor on the batch size. With
rollout.tensor_parallel_size TP > 1 the workers form one process group and each TP consecutive
ones run one engine, as the trainer's workers do: every rank of an engine is sent the engine's
batches."""

from __future__ import annotations

import time
from dataclasses import dataclass

from reasonrl_fast.errors import ConfigError
from reasonrl_fast.rollout import EngineSpec, sample_seeds
from reasonrl_fast.rollout.group import WorkerGroup, cluster_gpus, worker_bundle
from reasonrl_fast.rollout.worker import RolloutWorker
from reasonrl_fast.runtime.ray_cluster import start_ray, stop_ray


def generate_all(cfg, model_path: str, prompts: list[list[int]], spec: EngineSpec, log=print) -> list[list[int]]:
    """`eval.n` responses per prompt (token ids, prompt-major, in the prompts' order), sampled by
    the engine of `spec` (the driver's, so that an engine registered there reaches the workers)
    at eval.temperature and eval.top_p, sample i with `sample_seed(eval.seed, 0, i)`."""
    e = cfg.eval
    return generate_jobs(cfg, model_path, [Job(prompts, e.n, e.temperature, e.top_p, e.seed, 0)], spec, log)[0]


@dataclass
class Job:
    """Prompts to sample `n` times each at `temperature` and `top_p`, sample i of the job with
    `sample_seed(seed, stream, i)`."""

    prompts: list[list[int]]
    n: int
    temperature: float
    top_p: float
    seed: int
    stream: int | str


def generate_jobs(cfg, model_path: str, jobs: list[Job], spec: EngineSpec, log=print) -> list[list[list[int]]]:
    """Each job's responses (as `generate_all`'s), on one group of workers started once."""
    r = cfg.rollout
    owned = start_ray(cfg)
    group = None
    try:
        gpus = cluster_gpus()
        count = gpus or cfg.trainer.nnodes * cfg.trainer.workers_per_node
        size, tp = cfg.eval.prompts_per_batch, r.tensor_parallel_size
        batches = [(j, job.prompts[i:i + size], i) for j, job in enumerate(jobs)
                   for i in range(0, len(job.prompts), size)]
        if count < tp:
            raise ConfigError(f"rollout.tensor_parallel_size={tp}: an engine spans {tp} workers, and eval has "
                              f"{count} {'GPU' if gpus else 'CPU worker'}{'s' if count > 1 else ''}")
        engines = max(1, min(count // tp, len(batches)))
        count = engines * tp
        # on whichever GPUs the cluster has (packed), each engine's KV cache sized for one batch
        group = WorkerGroup(RolloutWorker, cfg, model_path, spec, count, worker_bundle(gpus, cfg.rollout_cpus),
                            nodes=1, sequences=size * max(job.n for job in jobs))
        group.setup("eval setup")  # a worker's UserError as itself
        t0 = time.perf_counter()
        log(f"[eval] {sum(len(job.prompts) for job in jobs)} prompts x "
            f"{'/'.join(str(n) for n in dict.fromkeys(job.n for job in jobs))} samples on {count} "
            f"{'GPU' if gpus else 'CPU'} worker(s)" + (f", {engines} engine(s) of {tp}" if tp > 1 else ""))
        # A worker runs its calls one after another: batch b goes to engine b mod engines, every
        # one of its ranks alike (the first one's samples are kept; the others' are the same)
        calls = []
        for b, (j, batch, first) in enumerate(batches):
            job = jobs[j]
            ranks = list(group.engine_ranks(b % engines))
            seeds = sample_seeds(job.seed, job.stream, first * job.n, len(batch) * job.n)
            calls.append((j, ranks, [group.actors[i].generate.remote(batch, job.n, job.temperature, job.top_p, seeds)
                                     for i in ranks]))
        out: list[list[list[int]]] = [[] for _ in jobs]
        for b, (j, ranks, refs) in enumerate(calls):
            out[j] += group.gather(refs, f"generate (eval batch {b})", ranks)[0]
        log(f"[eval] generated {sum(len(o) for o in out)} responses in {time.perf_counter() - t0:.1f}s")
        return out
    finally:
        if group is not None:
            group.shutdown()
        stop_ray(owned)
