"""The trainer's workers on Ray: `nnodes x workers_per_node` worker actors, a group of rollout
workers (rollout/group.py `WorkerGroup`: placed through a placement group, wired into one
torch.distributed group); calls fan out to all of them. Each worker keeps the samples it generated
for the step (`WorkerGroup.shares` is the one split rule), so the driver sends back only their
advantages."""

from __future__ import annotations

from reasonrl_fast.algos.correction import pool_sums, rollout_metrics
from reasonrl_fast.models.loading import load_model_config
from reasonrl_fast.rollout import get_rollout, sample_seeds
from reasonrl_fast.rollout.group import WorkerGroup, cluster_gpus, worker_bundle
from reasonrl_fast.runtime.ray_cluster import ClusterError, start_ray, stop_ray
from reasonrl_fast.trainer.worker import ROLLOUT_SUMS, Worker


class Cluster:
    def __init__(self, cfg, model_path: str):
        self.cfg = cfg
        self.spec = get_rollout(cfg.rollout.backend)
        self.owns_ray = start_ray(cfg)
        t = cfg.trainer
        world = t.nnodes * t.workers_per_node
        try:
            self.group = WorkerGroup(Worker, cfg, model_path, self.spec, world, worker_bundle(cfg, cluster_gpus()),
                                     log_dir=t.output_dir)
        except ClusterError:
            stop_ray(self.owns_ray)
            raise
        self.workers = self.group.actors
        try:
            self.setup_info = self.group.setup()[0]
            # the workers' config, context override included: checkpoints save it as config.json
            self.hf_config = load_model_config(model_path, cfg.model.max_position_embeddings)
        except BaseException:
            self.shutdown()  # the run ends here: its workers, placement group and Ray with it
            raise
        self.world = world
        self._kept: list[range] | None = None  # each worker's samples of the step's rollout

    def call(self, method: str, *args):
        return self.group.call(method, *args)

    def generate_stream(self, prompts: list[list[int]], n: int, temperature: float, top_p: float, stream: int | str,
                        keep: bool = False):
        """Steps 1-2 of the loop's step: n samples per prompt (prompt-major), the prompts shared out
        by `WorkerGroup.shares`: yields (index of the share's first sample, its responses) as each worker
        finishes, so the driver can score one share while the others still generate.
        Sample i of the call is drawn with `sample_seed(trainer.seed, stream, i)`, whichever
        worker draws it. `keep`: the step's training samples; each worker keeps its share for
        `train_step`."""
        split = self.group.shares(len(prompts))
        seed = self.cfg.trainer.seed
        # each worker is sent its engine's prompts (every rank of a tensor-parallel engine samples
        # them alike) and told which are its own, which it returns and keeps
        refs = [w.generate.remote([prompts[i] for i in g], n, temperature, top_p,
                                  sample_seeds(seed, stream, g.start * n, len(g) * n),
                                  own=(r.start - g.start, r.stop - g.start), keep=keep)
                for w, (g, r) in zip(self.workers, split)]
        if keep:
            self._kept = [range(r.start * n, r.stop * n) for _, r in split]
        for rank, responses in self.group.as_completed(refs, "generate"):
            yield split[rank][1].start * n, responses

    def train_step(self, adv: list[float], step: int) -> dict:
        """Step 4 of the loop's step: each worker trains on the samples it kept from the last
        `generate_stream(keep=True)`; it is sent only their advantages (`adv`: one per sample of
        the step, in order)."""
        kept, self._kept = self._kept, None
        if kept is None or kept[-1].stop != len(adv):
            raise ValueError(f"train_step: {len(adv)} advantages do not match the kept rollout")
        outs = self.group.gather([w.train_step.remote(adv[r.start:r.stop], step) for w, r in zip(self.workers, kept)],
                                 "train_step")
        return merge_updates(outs)

    def shutdown(self) -> None:
        self.group.shutdown()
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
