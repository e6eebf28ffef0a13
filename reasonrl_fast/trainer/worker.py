"""One FSDP rank as a Ray actor: a rollout worker (rollout/worker.py `RolloutWorker`: a rollout
engine with a full copy of the weights, or its rank of a tensor-parallel engine that spans
rollout.tensor_parallel_size workers, with 1/TP of them) that also owns a shard of the policy (and
of the frozen reference) and an optimiser, and updates them. The driver (loop.py) tells it what to
do; every method that touches sharded weights is called on all workers together. It keeps the
samples it generated for the step: the driver sends back only their advantages.

In split placement (trainer.placement=split) it holds no engine: the rollout workers sample, the
driver sends it its share of their samples with the advantages, and after the update its rank 0
sends the weights to the rollout workers (`publish`, rollout/transport.py)."""

from __future__ import annotations

import math
import resource
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from reasonrl_fast.algos import get_algo
from reasonrl_fast.algos.correction import pool_sums
from reasonrl_fast.models import LM_PREFIX, ZHEAD_PREFIX, ulysses
from reasonrl_fast.layout import mini_batches, resolve
from reasonrl_fast.models.lm_head import head_blocker, meta_model
from reasonrl_fast.models.loading import (enable_checkpointing, load_model, load_model_config, load_tokenizer,
                                          torch_dtype)
from reasonrl_fast.rollout.worker import RolloutWorker
from reasonrl_fast.runtime import checkpoint as ckpt
from reasonrl_fast.trainer import update
from reasonrl_fast.trainer.fsdp import (clip_grad_norm, gather_rank_major, init_distributed, iter_full, rank_major_world,
                                        replicate, shard)
from reasonrl_fast.trainer.policy import Actor
from reasonrl_fast.util import derive_seed
from reasonrl_fast.trainer.optim import make_optimizer
from reasonrl_fast.trainer.schedule import advance, make_scheduler


class Worker(RolloutWorker):
    """A rollout worker whose engine samples the policy it trains; `spec`: the driver's engine
    spec (rollout/registry.py). As a rollout worker's, its constructor only stores its arguments."""

    split = False  # split placement: no engine here; the weights go out by `publish`
    _turn_metrics: dict = {}  # the kept rollout's tool metrics (multi-turn), sent with its update's
    transport = None  # rank 0 in split placement: the weight transport's sending end

    def cpus(self) -> int:
        """The trainer role's CPU slots (colocated, its engine's too)."""
        return self.cfg.trainer.cpus_per_worker

    def setup(self, master_addr: str, master_port: int) -> dict:
        """Load and hold the model as the run's Layout says (layout/resolve.py `resolve`, the rules
        the planner and the driver's log read too): the policy (sharded or replicated), the
        rollout engine, the frozen reference where the algorithm needs one, the optimiser."""
        cfg = self.cfg
        self.device, mesh = init_distributed(self.rank, self.world, master_addr, master_port,
                                             cfg.trainer.collective_timeout_s, getattr(self, "_listen", None))
        torch.manual_seed(cfg.trainer.seed)  # same init of the Z-head on every rank
        self.tok = load_tokenizer(self.model_path)
        config = load_model_config(self.model_path, cfg.model.max_position_embeddings)
        # what only a built model shows against the fused head: built on the meta device, no memory
        self.layout = layout = resolve(cfg, config, self.device.type, self.world, self.spec,
                                       head_blocker=head_blocker(meta_model(config)))
        compute = torch_dtype(layout.compute_dtype)
        lm = load_model(self.model_path, torch_dtype(layout.weight_dtype), layout.attention,
                        cfg.model.max_position_embeddings)
        self.split = cfg.trainer.placement == "split"
        if not self.split:  # split placement: the rollout workers hold the engines
            self.load_engine(layout, lm, self.device)
        if cfg.model.gradient_checkpointing:  # after the rollout's copy: only the trained model recomputes
            enable_checkpointing(lm)
        self.algo = get_algo(cfg.algo)
        # the step's (prompts, responses, log-probs[, policy-token masks of multi-turn samples])
        self._samples: tuple | None = None
        # One decision for the run: the update, old and reference log-probs all take the same
        # path (layout.fused), so the ratio at the first update is exactly 1.
        self.actor = Actor(lm, cfg.flowrl.zhead_layers if self.algo.zhead else 0, fused=layout.fused,
                           zhead_pooling=cfg.flowrl.zhead_pooling)
        self._hold(self.actor, lm, mesh, compute)
        # what the update's forward runs through: DDP averages the gradients when replicated
        self.train_model = (replicate(self.actor, mesh, self.device) if layout.sharding == "replicate"
                            else self.actor)
        self.ref = None
        if self.algo.needs_ref(cfg):  # frozen reference, held the same way, in the dtype it
            ref_lm = load_model(self.model_path, compute, layout.attention,  # computes in (it has no update)
                                cfg.model.max_position_embeddings)
            self.ref = Actor(ref_lm, fused=layout.fused).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
            self._hold(self.ref, ref_lm, mesh, compute)
        self.sp_group = None
        if layout.sequence_parallel > 1:  # each packed row cut over the group (models/ulysses.py)
            self.sp_group = ulysses.group_of(self.rank, self.world, layout.sequence_parallel)
            for model in (self.actor, self.ref):
                if model is not None:
                    ulysses.use_ulysses(model.lm)
                    model.sp_group = self.sp_group
        o = cfg.optim
        z_params = [p for n, p in self.actor.named_parameters() if n.startswith(ZHEAD_PREFIX)]
        lm_params = [p for n, p in self.actor.named_parameters() if not n.startswith(ZHEAD_PREFIX)]
        groups = [{"params": lm_params, "lr": o.lr}]
        if z_params:
            groups.append({"params": z_params, "lr": o.lr * cfg.flowrl.zhead_lr_mult})
        # offloaded: the shards, so the optimizer's step, are the host's
        self.opt = make_optimizer(groups, cfg, torch.device("cpu") if layout.offload else self.device)
        self.sched = make_scheduler(self.opt, o.warmup_steps)
        self._base_lrs = [g["lr"] for g in groups]  # what a resume sets again (apply_optim_settings)
        return {"params": sum(p.numel() for p in lm_params), "device": str(self.device), "layout": layout.to_dict()}

    def _hold(self, module, lm, mesh, compute) -> None:
        """Shard `module` (FSDP2) from host memory, or move it whole to the device. fully_shard
        moves each unit to the device as it shards it, so the device holds one layer's full
        weights at a time beside the engine, never the model."""
        if self.layout.sharding == "fsdp":
            shard(module, lm, mesh, compute, self.layout.offload)
        else:
            module.to(self.device)

    # ------------------------------------------------------------------ rollout

    def generate(self, prompts: list[list[int]], n: int, temperature: float, top_p: float, seeds: list[int],
                 own: tuple[int, int] | None = None, keep: bool = False) -> list[list[int]]:
        """Step 1 of the loop's step: n responses per prompt (prompt-major), sample i drawn with
        seeds[i], at the caller's temperature and top-p (training's or validation's). `prompts` are
        the engine's: with a tensor-parallel engine every one of its ranks samples them all alike,
        and this worker's own are prompts[own[0]:own[1]] (None: all); it returns and keeps only
        its own. `keep`: these are the step's training samples (with the sampler's log-probs),
        which `train_step` trains on."""
        a, b = own or (0, len(prompts))
        out = self.sample(prompts, n, temperature, top_p, seeds, (a, b))
        if keep:
            self._samples = ([p for p in prompts[a:b] for _ in range(n)], out.tokens, out.logprobs, out.masks)
            self._turn_metrics = self.turn_metrics if self.cfg.rollout.tools else {}  # go out with the update's
        return out.tokens

    # ------------------------------------------------------------------ update

    def train_step(self, adv, step: int, samples: tuple[list, list, list] | None = None) -> dict:
        """Step 4 of the loop's step: reference and old log-probs, mini-batch updates, weight sync, on
        the samples this rank kept from the step's rollout (prompt-major groups of rollout.n); `adv` are their group-normalised
        advantages, in the same order. Each mini-batch runs as micro-batches whose gradients add
        up to the mini-batch's (update.py). `samples`: this rank's share of (prompts, responses,
        sampler log-probs) the driver holds (split placement's, from the rollout workers, whose
        weights go out by `publish`, called next; dynamic sampling's kept groups)."""
        cfg = self.cfg
        if samples is not None:
            self._samples = samples
        if self._samples is None:
            raise RuntimeError("train_step without a kept rollout (generate(..., keep=True))")
        prompts, responses, rollout_lps, *rest = self._samples  # a kept rollout's masks too
        masks = rest[0] if rest else None
        self._samples = None
        if len(adv) != len(responses):
            raise ValueError(f"train_step: {len(adv)} advantages for {len(responses)} kept samples")
        if self.engine is not None:
            self.engine.sleep()  # the engine's memory is the update's until the next sync
        sp = self.layout.sequence_parallel
        if sp > 1:  # the group trains on its ranks' samples together, each rank on its share of each row
            prompts, responses, rollout_lps, adv = ulysses.gather_samples(self.sp_group, prompts, responses,
                                                                          rollout_lps, list(adv))
        # the Z-head's dropout; alike on the ranks of a sequence-parallel group, which run it alike
        torch.manual_seed(derive_seed(cfg.trainer.seed, "update", step, self.rank // sp))
        adv = torch.tensor(adv, dtype=torch.float32, device=self.device)
        chunks = mini_batches(cfg, len(responses) // cfg.rollout.n)
        packed = self.layout.packed
        plans, totals = update.plan(prompts, responses, chunks, cfg.optim.micro_batch_tokens, packed,
                                    self.algo.loss_units(cfg), self.world, self.device, sp, masks)
        batches = [[update.micro_batch(prompts, responses, rollout_lps, idx, packed, self.tok.pad_token_id,
                                       self.device, self.layout.one_row, masks) for idx in micros] for micros in plans]
        t0 = time.perf_counter()
        temp = cfg.rollout.temperature
        ref_lp = update.logprobs(self.ref, batches, temp) if self.ref is not None else None
        if self.ref is not None and self.layout.sharding == "fsdp":
            # FSDP2 reshards a root unit in its backward, which the frozen reference never runs:
            # without this its embeddings and head would stay gathered through the update
            self.ref.reshard()
        # Old log-probs (π_prox, the weights at the start of the update, of docs/math.md
        # §Rollout correction) only matter when the policy moves between mini-batches; with one
        # mini-batch the current log-probs (detached) are the old ones, however old the sampler's.
        old_lp = update.logprobs(self.actor, batches, temp) if len(plans) > 1 else None
        logprob_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        self.actor.train()
        stats: dict[str, list[float]] = {}
        sums: list[dict] = []  # the rollout's gap and correction, per micro-batch
        skipped, norms = 0, []
        for b, micros in enumerate(plans):
            self.opt.zero_grad(set_to_none=True)
            st, s = update.accumulate(self.train_model, self.algo, cfg, responses, micros, batches[b], adv,
                                      totals[b], self.world, old_lp[b] if old_lp else None,
                                      ref_lp[b] if ref_lp else None, sp, masks)
            sums += s
            norm = float(clip_grad_norm(list(self.actor.parameters()), cfg.optim.grad_clip, self.device))
            if math.isfinite(norm):
                self.opt.step()
                norms.append(norm)
            else:  # same decision on every rank: the norm is global
                skipped += 1
            for key, v in st.items():
                stats.setdefault(key, []).append(v)
        self.opt.zero_grad(set_to_none=True)
        lr = advance(self.sched)  # the lr this step's updates used
        update_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        if self.device.type == "cuda":  # what the update freed goes back to the device, for the engine
            torch.cuda.empty_cache()
        if self.split:
            pass  # the driver calls `publish`, with the rollout workers' `receive_weights`
        elif step % cfg.rollout.sync_every == 0:
            self.sync_weights()
        else:
            self.engine.wake()  # the engine keeps the weights of the last sync
        out = update_metrics(stats, sums, norms, skipped, lr, sum(len(m) for m in plans), logprob_s, update_s,
                             time.perf_counter() - t0, self._peak_gb())
        out.update(self._turn_metrics)  # multi-turn rollouts: the step's tool metrics, this worker's
        self._turn_metrics = {}
        return out

    def _full_weights(self):
        """(Hugging Face name, full tensor) of the LM's parameters in the engine's dtype, a
        bucket per collective (every rank iterates them together)."""
        return iter_full(self._lm_named(), dtype=torch_dtype(self.layout.rollout_dtype))

    def _lm_named(self) -> list[tuple[str, torch.Tensor]]:
        """(Hugging Face name, detached parameter) of the LM, not the Z-head: what the engines load."""
        return [(name[len(LM_PREFIX):], p.detach()) for name, p in self.actor.named_parameters()
                if name.startswith(LM_PREFIX)]

    # ------------------------------------------------------------------ split placement

    def transport_address(self) -> tuple[str, int]:
        """Rank 0: its address and a port for the weight transport's store."""
        import ray

        from reasonrl_fast.runtime.distributed import rendezvous_socket

        host = ray.util.get_node_ip_address()
        self._transport_listen = rendezvous_socket(host)
        return host, self._transport_listen.getsockname()[1]

    def open_transport(self, host: str, port: int, size: int) -> tuple[list, str, int]:
        """Rank 0: transport rank 0 (the sender) of `size`; returns what the receivers need:
        the weights' (name, shape)s in the order they are sent, the dtype sent and the shards of
        the rank-major layout they arrive in (runtime/shards.py)."""
        from reasonrl_fast.rollout.transport import Transport

        self.transport = Transport(host, port, 0, size, self.cfg.trainer.collective_timeout_s,
                                   getattr(self, "_transport_listen", None))
        named = self._lm_named()
        meta = [(n, tuple(p.shape)) for n, p in named]
        return meta, self.layout.rollout_dtype, rank_major_world([p for _, p in named])

    def publish(self, meta: list, version: int) -> dict:
        """Every rank: gather the weights a bucket at a time into one rank-major buffer
        (fsdp.py `gather_rank_major`); rank 0 broadcasts each as it is, as version `version`, to
        the rollout workers (which call `receive_weights` at once and unpack it), so no rank holds
        a bucket twice, and returns the transfer's seconds and bytes (cluster.py
        `publish_metrics`)."""
        from reasonrl_fast.layout import SYNC_BUCKET_BYTES
        from reasonrl_fast.rollout.transport import buckets

        params, dtype = [p for _, p in self._lm_named()], torch_dtype(self.layout.rollout_dtype)
        bufs = (gather_rank_major([params[i] for i in idx], dtype)
                for idx in buckets(meta, dtype.itemsize, SYNC_BUCKET_BYTES))
        if self.rank == 0:
            sent, transfer_s = self.transport.send(bufs, meta, version, dtype, SYNC_BUCKET_BYTES,
                                                   rank_major_world(params))
            return {"time/transport_s": transfer_s, "perf/sync_gb": sent / 2**30}
        for _ in bufs:  # the gathers are collectives: every rank runs them
            pass
        return {}

    def weights_checksum(self) -> float:
        """transport.py `checksum` of the full weights in the engine's dtype (every rank calls it)."""
        from reasonrl_fast.rollout.transport import checksum

        return checksum([(n, t.clone()) for n, t in self._full_weights()])

    def sync_weights(self):
        """Gather the LM's parameters (not the Z-head), a bucket per collective, in the engine's
        dtype (the Layout's rollout dtype), and copy them into the rollout engine (which wakes
        first if it sleeps)."""
        if self.engine is not None:  # split placement: the driver publishes after a load
            self.load_weights(self._full_weights())

    # ------------------------------------------------------------------ checkpoints

    def save(self, path: str) -> None:
        model_sd, optim_sd = get_state_dict(self.actor, self.opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
        ckpt.save_rng(path, self.rank, self.sched)
        dist.barrier()

    def load(self, path: str) -> None:
        """`path` was checked complete and trusted by the driver before any worker reads it."""
        model_sd, optim_sd = get_state_dict(self.actor, self.opt)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.actor, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        ckpt.load_rng(path, self.rank, self.sched)
        apply_optim_settings(self.opt, self.sched, self._base_lrs, self.cfg.optim)
        self.sync_weights()

    # ------------------------------------------------------------------ misc

    def _peak_gb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated() / 2**30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def apply_optim_settings(opt, sched, base_lrs: list[float], o) -> None:
    """The run's optimizer settings `o` (cfg.optim) in every param group of `opt`, with
    `base_lrs` the groups' lrs as this run made them, after a checkpoint's states were loaded:
    the optimizer's state restores the saved run's lr, weight decay and betas and the scheduler's
    its base lrs, and a resumed run trains with its own (runtime/resume.py says which settings
    may change). Each group's lr is its new base at the schedule's position (a warm-up changed
    with it included), as the scheduler would have set it."""
    sched.base_lrs = list(base_lrs)
    lrs = [base * f(sched.last_epoch) for base, f in zip(base_lrs, sched.lr_lambdas, strict=True)]
    for g, base, lr in zip(opt.param_groups, base_lrs, lrs, strict=True):
        g["initial_lr"], g["weight_decay"], g["betas"] = base, o.weight_decay, tuple(o.betas)
        if isinstance(g["lr"], torch.Tensor):  # torchao's AdamW holds it as a tensor (runtime/checkpoint/trusted.py)
            g["lr"].fill_(lr)
        else:
            g["lr"] = lr
    sched._last_lr = lrs  # what get_last_lr() reports until the next step


ROLLOUT_SUMS = "rollout_sums"  # train_step's key for the sums of algos/correction.py


def update_metrics(stats: dict[str, list[float]], sums: list[dict], norms: list[float], skipped: int, lr: float,
                   micro_batches: int, logprob_s: float, update_s: float, sync_s: float, peak_gb: float) -> dict:
    """One worker's update metrics for the step (docs/trainer.md §Metrics), the one place that
    names them: `stats` the loss's statistics per mini-batch (update.accumulate), `sums` the
    rollout-gap sums per micro-batch, `norms` the finite gradient norms (one per update that
    stepped), `skipped` the updates skipped for a non-finite norm, `lr` the rate they ran at.
    The driver means them over workers (cluster.py `merge_updates`)."""
    out = {k: sum(v) / len(v) for k, v in stats.items()}
    out.update({"time/logprob_s": logprob_s, "time/update_s": update_s, "time/sync_s": sync_s,
                "train/micro_batches": micro_batches,
                "train/grad_norm": sum(norms) / len(norms) if norms else float("nan"),
                "train/skipped_updates": skipped, "train/lr": lr, "memory/peak_gb": peak_gb})
    out[ROLLOUT_SUMS] = pool_sums(sums)  # the driver pools them over workers
    return out
