"""The rules that tie sections together, run after each section's own checks: `validate(cfg)`.
The plug-ins' rules are asked by name through the registries (an algorithm's and the embedded
task's `check_config`, an engine's facts), so this module, like the rest of config, imports no
plug-in package."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from reasonrl_fast.config.checks import fail
from reasonrl_fast.config.sections import check_sections
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.protocol import API_KEY_ENV
from reasonrl_fast.redact import REDACTED, holds_redacted
from reasonrl_fast.registry import ALGOS, ROLLOUTS, TASKS
from reasonrl_fast.util import mini_batch_count

if TYPE_CHECKING:
    from reasonrl_fast.config import Config


def validate(cfg: Config) -> Config:
    """Each section's checks, then the rules that tie sections together."""
    _check_finite(cfg)
    check_sections(cfg)
    algo = ALGOS.lookup(cfg.algo)
    _check_not_redacted(cfg, skip=() if algo.uses_genrm else ("fapo.genrm.",))
    world = cfg.trainer.nnodes * cfg.trainer.workers_per_node
    p = cfg.data.prompts_per_step
    n_mb = mini_batch_count(p, cfg.optim.mini_batch_prompts)
    if p // world < n_mb:  # the workers' shares and mini-batches differ by one prompt at most
        raise ConfigError(f"data.prompts_per_step={p} over {world} workers in {n_mb} mini-batches "
                          f"(optim.mini_batch_prompts={cfg.optim.mini_batch_prompts}) leaves a worker a "
                          f"mini-batch without prompts: each needs at least one prompt per mini-batch")
    if cfg.data.filter_groups and cfg.rollout.n < 2:
        raise ConfigError(f"data.filter_groups={cfg.data.filter_groups} with rollout.n={cfg.rollout.n}: a group of one "
                          f"sample never has a spread, so every group would be dropped; set rollout.n >= 2")
    check_bf16_lr(cfg)
    check_sequence_cap(cfg, algo)
    check_tensor_parallel(cfg)
    check_placement(cfg)
    check_sequence_parallel(cfg)
    check_tools(cfg)
    algo.check_config(cfg)
    if cfg.embedded_task:  # its scorer's sandbox limit, its own limits (tasks/base.py)
        TASKS.lookup(cfg.data.task).check_settings(cfg)
    return cfg


def check_tensor_parallel(cfg: Config) -> None:
    """rollout.tensor_parallel_size against the engine and the workers: an engine that shards the
    model (`EngineSpec.tensor_parallel`), over consecutive workers of one node. What the model's
    shape allows is layout/resolve.py `tensor_parallel`'s (it needs the model's config)."""
    tp, per_node = cfg.rollout.tensor_parallel_size, cfg.trainer.workers_per_node
    if tp == 1:
        return
    if cfg.trainer.placement == "split":  # the engines have workers of their own
        per_node = None
    if not ROLLOUTS.lookup(cfg.rollout.backend).tensor_parallel:
        raise ConfigError(f"rollout.tensor_parallel_size={tp} needs an engine that shards the model over "
                          f"workers; rollout.backend={cfg.rollout.backend} holds the whole model in each "
                          f"worker: set rollout.backend=vllm, or rollout.tensor_parallel_size=1")
    if per_node is not None and per_node % tp:
        raise ConfigError(f"rollout.tensor_parallel_size={tp} does not divide trainer.workers_per_node="
                          f"{per_node}: an engine's ranks are {tp} consecutive workers of one node")


def check_sequence_cap(cfg: Config, algo) -> None:
    """rollout.max_sequence_tokens leaves every admitted prompt room for a response, and is not
    set with DAPO's overlong shaping (whose buffer counts back from one fixed response length)."""
    cap, p = cfg.rollout.max_sequence_tokens, cfg.data.max_prompt_length
    if not cap:
        return
    if cap <= p:
        raise ConfigError(f"rollout.max_sequence_tokens={cap} with data.max_prompt_length={p}: a prompt of the "
                          f"longest length would leave its response no token; set it above {p} (0: no cap)")
    buffer, _ = algo.overlong(cfg)
    if buffer:
        raise ConfigError(f"rollout.max_sequence_tokens={cap} with {algo.overlong_setting}={buffer}: the overlong "
                          f"shaping penalises lengths near one fixed limit, rollout.max_new_tokens, while the cap "
                          f"gives each response a limit of its own; set one of them to 0")


def check_sequence_parallel(cfg: Config) -> None:
    """trainer.sequence_parallel_size against the settings it needs before any model is read: it
    divides the trainer workers, and the rows it cuts are packed (layout/resolve.py checks the
    model's heads and head)."""
    t = cfg.trainer
    sp, world = t.sequence_parallel_size, t.nnodes * t.workers_per_node
    if sp == 1:
        return
    if world % sp:
        raise ConfigError(f"trainer.sequence_parallel_size={sp} does not divide the {world} trainer workers "
                          f"(trainer.nnodes x trainer.workers_per_node)")
    if cfg.data.packing == "false":
        raise ConfigError(f"trainer.sequence_parallel_size={sp} cuts packed rows: data.packing=false turns them off "
                          f"(set data.packing=auto)")


def check_tools(cfg: Config) -> None:
    """rollout.tools against what multi-turn samples do not reach yet: their masks travel with
    samples a worker keeps, not with those the driver sends (split placement, dynamic sampling),
    nor through sequence parallel's gather; and a tensor-parallel engine's ranks would each run the
    calls, whose answers (a timeout on one rank) could differ. Which tools can load is
    preflight's."""
    if not cfg.rollout.tools:
        return
    t = cfg.trainer
    for key, value, off in (("trainer.placement", t.placement, "colocated"),
                            ("data.filter_groups", cfg.data.filter_groups, None),
                            ("rollout.tensor_parallel_size", cfg.rollout.tensor_parallel_size, 1),
                            ("trainer.sequence_parallel_size", t.sequence_parallel_size, 1)):
        if value != off:
            raise ConfigError(f"rollout.tools with {key}={value}: multi-turn samples are not built for it yet; "
                              f"set {key}={off if off is not None else 'null'}, or leave rollout.tools empty")


def check_placement(cfg: Config) -> None:
    """trainer.placement against the settings that assume the other one. What needs the
    cluster's devices (an engine's TP workers on one node's GPUs) is trainer/cluster.py's."""
    t, r = cfg.trainer, cfg.rollout
    if t.placement == "colocated":
        if t.max_staleness:
            raise ConfigError(f"trainer.max_staleness={t.max_staleness} needs trainer.placement=split: colocated "
                              f"workers sample and train in turn, so no generation can overlap an update")
        return
    if r.workers > cfg.data.prompts_per_step:
        raise ConfigError(f"rollout.workers={r.workers} with data.prompts_per_step={cfg.data.prompts_per_step} "
                          f"leaves a rollout engine without prompts: at most one engine per prompt")
    if r.sync_every > 1:
        raise ConfigError(f"rollout.sync_every={r.sync_every} with trainer.placement=split: the rollout "
                          f"workers load every update, and trainer.max_staleness bounds how old their samples "
                          f"may be; set rollout.sync_every=1 (and trainer.max_staleness={r.sync_every - 1} "
                          f"for as stale a rollout)")


# The lowest lr bf16 master weights train at with round-to-nearest. bf16 keeps 8 significant
# bits, so the bf16 values around |w| are 2^(floor(log2|w|) - 7) apart and a new weight rounds
# back to the old one unless the step exceeds half that spacing. An AdamW step moves a weight by
# about lr (|m / sqrt(v)| ~ 1 while its gradient keeps a sign, less when it does not), and an
# LLM's weights sit around |w| ~ 0.01-0.02 (init std 0.02: median |w| 0.0135, in [2^-7, 2^-6)):
# half the spacing there is 2^-7 * 2^-8 = 2^-15 ~ 3.05e-5. Below it the median weight never moves
# (benchmarks/RESULTS.md §18: at lr 1e-6 about 2 % of the elements of a 0.02-std matrix do); at
# it, about half of them (|w| < 2^-6) can.
BF16_MIN_LR = 2.0 ** -15


def check_bf16_lr(cfg: Config) -> None:
    """ConfigError when bf16 master weights would round their updates away: a learning rate (the
    LM's, and FlowRL's Z-head group's, which is held in the LM's dtype) below BF16_MIN_LR without
    stochastic rounding; or stochastic rounding asked for over weights that are not bf16."""
    o, bf16 = cfg.optim, cfg.model.dtype == "bfloat16"
    if o.bf16_stochastic_round and not bf16:
        raise ConfigError(f"optim.bf16_stochastic_round=true needs model.dtype=bfloat16, got "
                          f"model.dtype={cfg.model.dtype!r}: float32 master weights keep every update "
                          f"and are not rounded to bf16")
    if not bf16 or o.bf16_stochastic_round:
        return
    lrs = {"optim.lr": o.lr}
    if ALGOS.lookup(cfg.algo).zhead:
        lrs["optim.lr x flowrl.zhead_lr_mult"] = o.lr * cfg.flowrl.zhead_lr_mult
    for key, lr in lrs.items():
        if 0 < lr < BF16_MIN_LR:  # 0: a group meant not to move
            raise ConfigError(f"model.dtype=bfloat16 with {key}={lr:g}: below {BF16_MIN_LR:.3g}, half of "
                              f"bf16's spacing at a typical weight (|w| ~ 0.01), an AdamW step rounds away "
                              f"and the weights do not train; set model.dtype=float32, or "
                              f"optim.bf16_stochastic_round=true")


def _check_finite(section, at: str = "") -> None:
    """Every number a finite one, and every int one that fits in 64 bits. A section's range
    checks compare (lr > 0, temperature > 0), and inf passes those while nan fails none of
    `not x < 0`: no setting means either; a larger int overflows torch's and numpy's integers."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            _check_finite(value, f"{at}{f.name}.")
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                fail(f"{at}{f.name}", value, "must be a finite number")
            if isinstance(v, int) and not -2**63 <= v < 2**63:  # what torch and numpy hold
                fail(f"{at}{f.name}", value, "must fit in 64 bits")


def _check_not_redacted(section, at: str = "", skip: tuple[str, ...] = ()) -> None:
    """No setting the run uses holds the marker `to_yaml` writes in place of a secret: a run's
    config.yaml given back as the config file would otherwise send "<redacted>" as the GenRM's
    key, and the GenRM's refusals leave every answer unpenalised (fail open). Sections in `skip`
    are not used by the run (the GenRM's, unless the algorithm asks it). The eval command given
    a FAPO run's config.yaml is refused too (it cannot tell), and the message says how to go on:
    `fapo.genrm.api_key=''` empties the key."""
    for f in dataclasses.fields(section):
        value, key = getattr(section, f.name), f"{at}{f.name}"
        if key.startswith(skip):
            continue
        if dataclasses.is_dataclass(value):
            _check_not_redacted(value, f"{key}.", skip)
        elif holds_redacted(value):
            how = (f"; or empty it ({key}='') for ${API_KEY_ENV}" if key == "fapo.genrm.api_key" else "")
            raise ConfigError(f"{key} holds {REDACTED}, what a run's config.yaml writes in place of a secret: "
                              f"give the real value{how}")


__all__ = ["BF16_MIN_LR", "check_bf16_lr", "check_placement", "check_tensor_parallel", "validate"]
