"""Sampling for the eval command on Ray: one actor per GPU of the cluster when there are GPUs,
else `trainer.nnodes x trainer.workers_per_node` CPU actors of `trainer.cpus_per_worker` slots.
Each actor loads the model once; prompts go out in fixed batches, and sample i of the run is drawn
with `sample_seed(eval.seed, 0, i)`, so the samples depend neither on how many actors there are nor
on the batch size. With rollout.tensor_parallel_size TP > 1 the actors form one process group and
each TP consecutive ones run one engine, as the trainer's workers do: every rank of an engine is
sent the engine's batches."""

from __future__ import annotations

import re
import time

import ray
import torch

from reasonrl_fast.layout import resolve
from reasonrl_fast.models.loading import load_model, load_model_config, load_tokenizer, torch_dtype
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.rollout import Rollout, make_rollout, sample_seeds
from reasonrl_fast.runtime.distributed import init_process_group, rendezvous_address
from reasonrl_fast.runtime.ray_cluster import WorkerError, gather, start_ray, stop_ray, user_error


class Generator:
    """One Ray actor: the engine `rollout` (the driver's registry entry, so an engine registered
    there reaches the actor) over the model at `model_path`, built by `setup` (not the
    constructor: an error there reaches the driver only as text, a method's as itself)."""

    def __init__(self, cfg, model_path: str, rollout: Rollout, rank: int = 0, world: int = 1):
        # rank, world: this actor's place among a tensor-parallel eval's actors (world 1: alone)
        self.cfg, self.model_path, self.rollout, self.rank, self.world = cfg, model_path, rollout, rank, world

    def address(self) -> tuple[str, int]:
        """Rank 0's address and a port for the process group's rendezvous."""
        return rendezvous_address(self)

    def setup(self, master_addr: str | None = None, master_port: int | None = None) -> None:
        cfg, model_path = self.cfg, self.model_path
        cuda = torch.cuda.is_available()
        if not cuda:
            torch.set_num_threads(max(1, cfg.trainer.cpus_per_worker))
        if self.world > 1:  # the engines' ranks find each other (rank 0's `address`)
            init_process_group(self.rank, self.world, master_addr, master_port, cfg.trainer.collective_timeout_s,
                               getattr(self, "_listen", None))
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        tok = load_tokenizer(model_path)
        # Sampled as the run's workers sample: the engine's dtype and memory from the Layout of
        # the run's config (layout/), its KV cache sized for one batch at once
        t = cfg.trainer
        config = load_model_config(model_path, cfg.model.max_position_embeddings)
        layout = resolve(cfg, config, device.type, t.nnodes * t.workers_per_node, self.rollout,
                         sequences=cfg.eval.prompts_per_batch * cfg.eval.n)
        lm = (load_model(model_path, torch_dtype(layout.compute_dtype), layout.attention,
                         cfg.model.max_position_embeddings).to(device)
              if self.rollout.needs_trainer_copy else None)
        self.engine = make_rollout(cfg, layout, lm, model_path, tok.pad_token_id, tok.eos_token_id, device,
                                   rollout=self.rollout)
        del lm  # the engine holds its own copy

    def generate(self, prompts: list[list[int]], n: int, temperature: float, top_p: float,
                 max_new_tokens: int, seeds: list[int]) -> list[list[int]]:
        return self.engine.generate(prompts, n, temperature, top_p, max_new_tokens, seeds).tokens


def _why(err: Exception) -> str:
    """The first line of Ray's report and, when there is one, the exception that ended the actor
    (Ray puts the creation task's traceback in the message)."""
    lines = [x.strip() for x in str(err).splitlines() if x.strip()]
    cause = next((x for x in reversed(lines) if re.match(r"^[\w.]+(Error|Exception|Exit)\b", x)), "")
    return (lines[0] if lines else type(err).__name__) + (f" ({cause})" if cause else "")


def _who(batch: int, engines: int, tp: int) -> str:
    """The failed actor of batch `batch`'s engine: its rank where one engine has one rank, else
    the engine's ranks."""
    first = batch % engines * tp
    return str(first) if tp == 1 else f"of ranks {first}-{first + tp - 1}"


def generate_all(cfg, model_path: str, prompts: list[list[int]], rollout: Rollout, log=print) -> list[list[int]]:
    """`eval.n` responses per prompt (token ids, prompt-major, in the prompts' order), sampled by
    the engine `rollout`."""
    e, r = cfg.eval, cfg.rollout
    owned = start_ray(cfg)
    actors = []
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus:
            count, opts = gpus, {"num_gpus": 1, "num_cpus": 1}
        else:
            count = cfg.trainer.nnodes * cfg.trainer.workers_per_node
            opts = {"num_cpus": cfg.trainer.cpus_per_worker}
        size, tp = e.prompts_per_batch, r.tensor_parallel_size
        batches = [prompts[i:i + size] for i in range(0, len(prompts), size)]
        if count < tp:
            raise ConfigError(f"rollout.tensor_parallel_size={tp}: an engine spans {tp} workers, and eval has "
                              f"{count} {'GPU' if gpus else 'CPU worker'}{'s' if count > 1 else ''}")
        engines = max(1, min(count // tp, len(batches)))
        count = engines * tp
        remote = ray.remote(Generator)
        actors = [remote.options(**opts).remote(cfg, model_path, rollout, rank, count) for rank in range(count)]
        addr = gather([actors[0].address.remote()], "eval setup")[0] if count > 1 else (None, None)
        gather([a.setup.remote(*addr) for a in actors], "eval setup")  # a worker's UserError as itself
        t0 = time.perf_counter()
        log(f"[eval] {len(prompts)} prompts x {e.n} samples on {count} {'GPU' if gpus else 'CPU'} worker(s)"
            + (f", {engines} engine(s) of {tp}" if tp > 1 else ""))
        # An actor runs its calls one after another: batch b goes to engine b mod engines, every
        # one of its ranks alike (the first one's samples are kept; the others' are the same)
        refs = [[a.generate.remote(batch, e.n, e.temperature, e.top_p, r.max_new_tokens,
                                   sample_seeds(e.seed, 0, b * size * e.n, len(batch) * e.n))
                 for a in actors[b % engines * tp:(b % engines + 1) * tp]]
                for b, batch in enumerate(batches)]
        out: list[list[int]] = []
        for b, ranks in enumerate(refs):
            try:
                out += ray.get(ranks)[0]
            except ray.exceptions.RayActorError as err:
                raise WorkerError(f"eval worker {_who(b, engines, tp)} died: {_why(err)}") from err
            except ray.exceptions.RayTaskError as err:
                if user_error(err) is not None:
                    raise user_error(err) from None
                raise WorkerError(f"eval worker {_who(b, engines, tp)} failed on batch {b}: "
                                  f"{getattr(err, 'cause', err)!r}") from err
        log(f"[eval] generated {len(out)} responses in {time.perf_counter() - t0:.1f}s")
        return out
    finally:
        for a in actors:
            ray.kill(a)
        stop_ray(owned)
