"""The trainer's workers on Ray: `nnodes x workers_per_node` worker actors placed through a
placement group, wired into one torch.distributed group; calls fan out to all of them. Each
worker keeps the samples it generated for the step (`util.engine_shares` is the one split rule), so the
driver sends back only their advantages."""

from __future__ import annotations

from contextlib import contextmanager

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from reasonrl_fast.algos.correction import pool_sums, rollout_metrics
from reasonrl_fast.models.loading import load_model_config
from reasonrl_fast.rollout import get_rollout, sample_seeds
from reasonrl_fast.runtime import ray_cluster as rt
from reasonrl_fast.runtime.ray_cluster import (ClusterError, WorkerError, as_completed, gather, place_workers,
                                               start_ray, stop_ray)
from reasonrl_fast.trainer.worker import ROLLOUT_SUMS, Worker
from reasonrl_fast.util import engine_shares


class Cluster:
    def __init__(self, cfg, model_path: str):
        self.cfg = cfg
        self.rollout = get_rollout(cfg.rollout.backend)
        self.owns_ray = start_ray(cfg)
        t = cfg.trainer
        world = t.nnodes * t.workers_per_node
        gpu = bool(ray.cluster_resources().get("GPU", 0))
        bundle = {"GPU": 1, "CPU": 1} if gpu else {"CPU": t.cpus_per_worker}
        try:
            self.pg = place_workers(t, bundle, local=rt.is_local())
        except ClusterError:
            stop_ray(self.owns_ray)
            raise
        remote = ray.remote(Worker)
        self.workers = [
            remote.options(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                           scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i)
                           ).remote(cfg, i, world, model_path, self.rollout)
            for i in range(world)]
        try:
            # Every call to the workers goes through `gather` (runtime/ray_cluster.py), which
            # raises a worker's UserError as itself: a model directory without weights, a
            # setting only the device can judge, a model the trainer cannot train.
            addr, port = gather([self.workers[0].address.remote()], "startup")[0]
            with self._engine_notes():
                self.setup_info = gather([w.setup.remote(addr, port) for w in self.workers], "setup")[0]
            # the workers' config, context override included: checkpoints save it as config.json
            self.hf_config = load_model_config(model_path, cfg.model.max_position_embeddings)
        except BaseException:
            self.shutdown()  # the run ends here: its workers, placement group and Ray with it
            raise
        self.world = world
        self._kept: list[range] | None = None  # each worker's samples of the step's rollout

    @contextmanager
    def _engine_notes(self):
        """A worker's failure, with what its rollout engine adds (`Rollout.error_note`: the
        engine log's last line) when it has something."""
        try:
            yield
        except WorkerError as e:
            note = self.rollout.error_note(self.cfg.trainer.output_dir, e.rank) if e.rank is not None else None
            if not note:
                raise
            raise WorkerError(f"{e}; {note}", rank=e.rank) from e

    def call(self, method: str, *args):
        with self._engine_notes():
            return gather([getattr(w, method).remote(*args) for w in self.workers], method)

    def generate_stream(self, prompts: list[list[int]], n: int, temperature: float, top_p: float, stream: int | str,
                        keep: bool = False):
        """Steps 1-2 of the loop's step: n samples per prompt (prompt-major), the prompts shared out
        by `engine_shares`: yields (index of the share's first sample, its responses) as each worker
        finishes, so the driver can score one share while the others still generate.
        Sample i of the call is drawn with `sample_seed(trainer.seed, stream, i)`, whichever
        worker draws it. `keep`: the step's training samples; each worker keeps its share for
        `train_step`."""
        split = engine_shares(len(prompts), self.world, self.cfg.rollout.tensor_parallel_size)
        seed = self.cfg.trainer.seed
        # each worker is sent its engine's prompts (every rank of a tensor-parallel engine samples
        # them alike) and told which are its own, which it returns and keeps
        refs = [w.generate.remote([prompts[i] for i in g], n, temperature, top_p,
                                  sample_seeds(seed, stream, g.start * n, len(g) * n), keep,
                                  (r.start - g.start, r.stop - g.start))
                for w, (g, r) in zip(self.workers, split)]
        if keep:
            self._kept = [range(r.start * n, r.stop * n) for _, r in split]
        with self._engine_notes():
            for rank, responses in as_completed(refs, "generate"):
                yield split[rank][1].start * n, responses

    def train_step(self, adv: list[float], step: int) -> dict:
        """Step 4 of the loop's step: each worker trains on the samples it kept from the last
        `generate_stream(keep=True)`; it is sent only their advantages (`adv`: one per sample of
        the step, in order)."""
        kept, self._kept = self._kept, None
        if kept is None or kept[-1].stop != len(adv):
            raise ValueError(f"train_step: {len(adv)} advantages do not match the kept rollout")
        with self._engine_notes():
            outs = gather([w.train_step.remote(adv[r.start:r.stop], step) for w, r in zip(self.workers, kept)],
                          "train_step")
        return merge_updates(outs)

    def shutdown(self) -> None:
        # Best effort and bounded: after a failure a surviving rank may still be blocked in a
        # collective, and its shutdown call would queue behind that forever.
        ray.wait([w.shutdown.remote() for w in self.workers], num_returns=len(self.workers), timeout=10)
        for w in self.workers:
            ray.kill(w)
        remove_placement_group(self.pg)
        stop_ray(self.owns_ray)


def merge_updates(outs: list[dict]) -> dict:
    """The step's update metrics from every worker's (worker.py `update_metrics`): the mean over
    workers, the largest peak memory, the skipped updates as counted alike on every worker, and
    the rollout/* metrics over all tokens from the pooled sums."""
    sums = pool_sums(o.pop(ROLLOUT_SUMS) for o in outs)
    merged = {k: sum(o[k] for o in outs) / len(outs) for k in outs[0]}
    merged["memory/peak_gb"] = max(o["memory/peak_gb"] for o in outs)
    merged["train/skipped_updates"] = outs[0]["train/skipped_updates"]
    merged.update(rollout_metrics(sums))
    return merged
