"""One rollout worker (rollout/worker.py `RolloutWorker`): the eval command's workers are rollout
workers, and the trainer's workers are rollout workers extended with the update, sampling through
the same methods; both start them as a WorkerGroup (rollout/group.py). Here the group runs in
process (no Ray), on a tiny model directory and the hf engine: eval's samples are the trainer
worker's for the same seeds. Unit tier: a few seconds on CPU."""

from __future__ import annotations

import pytest

from reasonrl_fast.config import load_config
from reasonrl_fast.eval import generate as eval_generate
from reasonrl_fast.rollout import get_rollout, sample_seeds
from reasonrl_fast.rollout.worker import RolloutWorker
from reasonrl_fast.trainer import cluster as cluster_mod
from reasonrl_fast.trainer.worker import Worker
from tests.helpers.model_dirs import model_dir

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


class InProcessGroup:
    """rollout/group.py `WorkerGroup` without Ray: its workers built and called in this process."""

    made: list = []

    def __init__(self, cls, cfg, model_path, spec, count, bundle, **kwargs):
        kwargs.pop("log_dir", None)
        kwargs.pop("nodes", None)
        self.cls, self.tp = cls, cfg.rollout.tensor_parallel_size
        self.actors = [Remote(cls(cfg, i, count, model_path, spec, **kwargs)) for i in range(count)]
        InProcessGroup.made.append(self)

    def setup(self, what="setup"):
        return [a.worker.setup() for a in self.actors]

    def engine_ranks(self, engine):
        return range(engine * self.tp, (engine + 1) * self.tp)

    def gather(self, values, what, ranks=None):
        return list(values)

    def shutdown(self):
        for a in self.actors:
            a.worker.shutdown()


class Remote:
    """An actor handle whose `.method.remote(...)` runs the worker's method at once."""

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, name):
        return type("Method", (), {"remote": staticmethod(getattr(self.worker, name))})()


def test_eval_and_the_trainer_sample_with_one_rollout_worker(tmp_path, monkeypatch):
    path = model_dir(tmp_path / "m", "llama")
    cfg = load_config(None, [f"model.path={path}", "trainer.workers_per_node=1", "rollout.max_new_tokens=6",
                             "data.max_prompt_length=8", "eval.n=2", "eval.temperature=1.0", "eval.top_p=0.9",
                             "eval.prompts_per_batch=4", f"trainer.output_dir={tmp_path / 'run'}"])
    spec = get_rollout("hf")
    InProcessGroup.made = []
    monkeypatch.setattr(eval_generate, "WorkerGroup", InProcessGroup)
    monkeypatch.setattr(eval_generate, "start_ray", lambda cfg: False)
    monkeypatch.setattr(eval_generate, "stop_ray", lambda owned: None)
    monkeypatch.setattr(eval_generate, "cluster_gpus", lambda: 0)
    evaluated = eval_generate.generate_all(cfg, path, PROMPTS, spec, log=lambda msg: None)
    (group,) = InProcessGroup.made
    assert group.cls is RolloutWorker  # eval's workers are rollout workers, nothing more

    # the trainer's cluster starts its workers the same way, as rollout workers that also train
    seen = {}

    def record(cls, *args, **kwargs):
        seen["cls"] = cls
        raise RuntimeError("recorded")

    monkeypatch.setattr(cluster_mod, "WorkerGroup", record)
    monkeypatch.setattr(cluster_mod, "start_ray", lambda cfg: False)
    monkeypatch.setattr(cluster_mod, "cluster_gpus", lambda: 0)
    with pytest.raises(RuntimeError, match="recorded"):
        cluster_mod.Cluster(cfg, path)
    assert seen["cls"] is Worker and issubclass(Worker, RolloutWorker)
    for method in ("address", "load_engine", "sample", "load_weights", "shutdown"):  # the sampling part, shared
        assert getattr(Worker, method) is getattr(RolloutWorker, method), method

    # and samples as eval does: the same seeds draw the same responses
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):  # what the process group leaves set
        monkeypatch.setenv(key, "")
    w = Worker(cfg, 0, 1, path, spec)
    try:
        w.setup(*w.address())
        trained = w.generate(PROMPTS, 2, 1.0, 0.9, sample_seeds(cfg.eval.seed, 0, 0, len(PROMPTS) * 2))
    finally:
        w.shutdown()
    assert len(evaluated) == len(PROMPTS) * 2 and any(evaluated)
    assert trained == evaluated


def test_a_group_names_the_rank_a_call_went_to_with_its_engines_note(tmp_path, monkeypatch):
    """Eval sends a batch to one engine's ranks only: a failure there names the worker's rank in
    the group (not the call's place in the batch), with the engine log's last line, as the
    trainer's calls are reported."""
    import ray

    from reasonrl_fast.rollout import group as group_mod
    from reasonrl_fast.runtime import ray_cluster
    from reasonrl_fast.runtime.ray_cluster import WorkerError

    class Dead:  # an object ref whose actor died
        pass

    def get(ref):
        if isinstance(ref, Dead):
            raise ray.exceptions.RayActorError()
        return ref

    monkeypatch.setattr(ray_cluster.ray, "wait", lambda pending, num_returns: (pending[:1], pending[1:]))
    monkeypatch.setattr(ray_cluster.ray, "get", get)
    spec = get_rollout("vllm")
    log = spec.log_path(str(tmp_path), 5)
    (tmp_path / "rollout").mkdir()
    with open(log, "w") as f:
        f.write("starting\nKV cache too small\n")
    g = group_mod.WorkerGroup.__new__(group_mod.WorkerGroup)
    g.spec, g.log_dir = spec, str(tmp_path)
    assert g.gather(["a", "b"], "generate", [4, 5]) == ["a", "b"]
    with pytest.raises(WorkerError, match=r"^worker rank 5 died during generate \(batch 1\): .*"
                                          r"vLLM engine's last log line .*: KV cache too small$") as e:
        g.gather(["a", Dead()], "generate (batch 1)", [4, 5])
    assert e.value.rank == 5
    g.log_dir = None  # workers that write no log of their own: the failure as it is
    with pytest.raises(WorkerError, match=r"^worker rank 4 died during generate: [^;]*$"):
        g.gather([Dead(), "b"], "generate", [4, 5])

    # split placement's publish waits on both groups at once: a dead rollout worker is named as one,
    # by its rank in its own group, with its engine's note
    rollout = group_mod.WorkerGroup.__new__(group_mod.WorkerGroup)
    rollout.spec, rollout.log_dir, rollout.role = spec, str(tmp_path), "rollout worker"
    assert group_mod.WorkerGroup.gather_all([(g, ["t0", "t1"]), (rollout, ["r0"])], "weight transport") == [
        ["t0", "t1"], ["r0"]]
    calls = [(g, ["t0", "t1"]), (rollout, ["r0", "r1", "r2", "r3", "r4", Dead()])]
    with pytest.raises(WorkerError, match=r"^rollout worker rank 5 died during weight transport: .*"
                                          r"vLLM engine's last log line .*: KV cache too small$") as e:
        group_mod.WorkerGroup.gather_all(calls, "weight transport")
    assert e.value.rank == 5
