"""`python -m reasonrl_fast.rehearse CONFIG [key=value ...] [--output-dir DIR]`: a dress rehearsal
of a recipe on this machine's CPU, in minutes, so that a recipe is known to run before anyone
books a GPU cluster.

First the recipe as it is goes through the trainer's preflight against its real model's config
(model.path's config.json, else the shipped shape named like the directory, shipped_shapes.SHAPES):
what would stop the real run before Ray starts stops the rehearsal the same way, with one line.
Then the recipe runs for real, through the trainer (trainer/loop.py: Ray, two gloo workers,
FSDP2 with bf16 compute over the recipe's master dtype, as a GPU runs it), scaled by one rule:

  settings stay, sizes shrink.
  - model: the recipe model's architecture (model_type, query:key/value head ratio, tied
    embeddings, the real vocabulary size, RoPE, the context) with small widths and two layers
    (models/stand_in.py), random weights, the character tokenizer (a minimal chat template when
    the records are chat messages), warm-started for a few steps on the stand-in records'
    reference answers so that some responses are right (FAPO asks its GenRM about right
    answers only; trainer/stand_ins.py writes the stand-ins); the embedded model is rehearsed
    as it is, its warm start shortened;
  - lengths: every token length (data.max_prompt_length, rollout.max_new_tokens,
    grpo.overlong_buffer, flowrl.overlong_buffer, optim.micro_batch_tokens, fapo.genrm.max_tokens)
    divided by one factor, the smallest power of two that brings prompt + response to
    SEQUENCE_TOKENS or fewer, halved while the prompt would not hold the stand-in records' longest
    one (the stand-in GenRM's verdicts cut at GENRM_TOKENS at most);
  - batch: at most SAMPLES_PER_STEP samples a step (data.prompts_per_step x rollout.n, the group
    size kept), optimizer steps per RL step kept where each of the two workers still gets a
    prompt in every mini-batch, else as many as they can; dynamic sampling's generation batch
    (data.gen_prompts_per_step) in the recipe's proportion to it;
  - data: stand-in records (data/stand_in.py: one example per scorer kind) with the data_source
    each file's records carry (where the file is on this machine), else the one
    data.train_sources / data.val_sources names for it, VAL_PROMPTS validation prompts, each
    sampled rollout.val_n times, at most VAL_N;
  - GenRM (FAPO): a random stand-in of the GenRM's architecture served by our server's hf
    backend, started by the trainer itself; its verdicts are mostly unparseable, which the
    client counts as failures (no penalty), as it would a real GenRM's;
  - placement: split placement (trainer.placement=split) with one rollout worker, its engine as
    below, trainer.max_staleness kept;
  - parallelism: a recipe's Ulysses sequence parallel (trainer.sequence_parallel_size) over the
    two workers, the stand-in's query heads as many as that splits; trainer.offload kept;
  - steps: STEPS steps with a checkpoint each, then a second run that resumes from the last
    checkpoint to step STEPS + 1. A run in which nothing could learn fails the rehearsal with
    exit status 1 (`nothing_learns`: a step whose rewards all timed out or failed, or gradients
    exactly 0 at every step).
Every other setting (algorithm, dtypes, packing, gradient checkpointing, fused head, clip
ratios, loss aggregation, KL, Z-head, warm-up, sampling and validation settings, GenRM client
settings) is the recipe's. The recipe's rollout engine (vLLM) is used where it is importable,
its tensor-parallel size at most the two workers (the stand-in's heads made divisible by it,
and as wide as its CPU attention takes),
else the hf rollout with the whole model in each worker, said in one line. The run directory
is a temporary one, removed after a rehearsal that passes (--output-dir keeps everything: the
stand-in model, the records, the run).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from omegaconf import OmegaConf

from reasonrl_fast import cli
from reasonrl_fast.config import Config, load_config, validate
from reasonrl_fast.errors import UserError
from reasonrl_fast.layout import mini_batch_count
from reasonrl_fast.rollout.registry import FALLBACK, get_rollout

SEQUENCE_TOKENS = 64
"""The longest sequence (prompt + response) after scaling. Sampling over the real vocabulary
costs about rows x vocabulary per token on CPU (the sampler's noise and top-p), so the response
length, not the model, sets a rehearsal's time."""
SAMPLES_PER_STEP = 32
"""Samples a rehearsal step generates at most (prompts x rollout.n): 16 rows per worker."""
WORKERS = 2
VAL_PROMPTS = 2
"""Validation prompts: one per worker, each sampled rollout.val_n times."""
VAL_N = 4
"""Samples per validation prompt, at most: a recipe's 16 or 32 made the three validations (before the
first step, after the last, after the resumed one) about a quarter of a rehearsal, each sampling
over the real vocabulary; 4 keeps what k > 1 logs (pass@k, the diversity metrics)."""
TRAIN_PROMPTS = 16
STEPS = 2
EMBEDDED_SFT_STEPS = 60
"""The embedded model's warm start in a rehearsal, at most: enough that a group's sampled
responses are not all scored alike, or every advantage is 0 and the rehearsal fails as one in
which nothing learns (`nothing_learns`). At 20 steps every verdict of the genrm task's model
scored -1; at 60 (its recipe's own) they differ, in a few seconds."""
EMBEDDED_TRAIN_SIZE = 256
GENRM_TOKENS = 8
"""The stand-in GenRM's verdict limit, at most (after the length factor): its random weights
write no verdict at any length, so each request ends truncated, counted as a failure (no
penalty) as a real GenRM's cut verdict is; every token samples over the real vocabulary, which
made the verdicts most of a FAPO rehearsal's step at 64 tokens (at 16 a third, 3.4 s of a 7.5 s
step of the 32B FAPO recipe; at 8, 2 s)."""
LENGTHS = ("data.max_prompt_length", "rollout.max_new_tokens", "rollout.max_sequence_tokens", "grpo.overlong_buffer",
           "flowrl.overlong_buffer", "optim.micro_batch_tokens", "fapo.genrm.max_tokens")
"""Every setting counted in tokens: the ones the length factor divides."""


class RehearsalError(UserError, RuntimeError):
    """The recipe ran but did not do what a rehearsal checks (a checkpoint resumed)."""


class NothingLearned(RuntimeError):
    """The recipe ran, but nothing in it could learn (`nothing_learns`): the rehearsal fails with
    exit status 1, as the planner does for a run that does not fit (2 is for bad input)."""


def nothing_learns(rows: list[dict], samples: int) -> str | None:
    """Why no step of a run could teach the model anything, from its metrics rows (the training
    rows: those with train/grad_norm), or None. A step whose `samples` rewards all timed out or failed
    (reward/timeouts + reward/errors, trainer/loop.py) scores every sample 0: the advantages are
    0, and the update learns nothing from the recipe's reward. A train/grad_norm of exactly 0 at every
    step (or none: every update skipped for a non-finite norm) means no weight moved at all."""
    steps = [r for r in rows if "train/grad_norm" in r]
    for r in steps:
        timeouts, errors = r.get("reward/timeouts") or 0, r.get("reward/errors") or 0
        if timeouts + errors >= samples:
            return (f"step {r['step']}: every reward timed out or failed (reward/timeouts={timeouts}, "
                    f"reward/errors={errors} of {samples} samples): nothing could learn from the reward")
    if steps and all(not r["train/grad_norm"] for r in steps):  # 0, or None (non-finite, every update skipped)
        return (f"train/grad_norm is {steps[0]['train/grad_norm']} at every step "
                f"(steps {steps[0]['step']}-{steps[-1]['step']}): no update moved a weight")
    return None


# ---------------------------------------------------------------- the scaling rule (pure)


def get(cfg, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def length_factor(cfg: Config, prompt_tokens: int = 1) -> int:
    """The smallest power of two that divides prompt + response down to SEQUENCE_TOKENS or fewer,
    halved while the divided prompt length would be below `prompt_tokens` (the stand-in records'
    longest prompt)."""
    p, f = cfg.data.max_prompt_length, 1
    while cfg.max_sequence > f * SEQUENCE_TOKENS:
        f *= 2
    while f > 1 and -(-p // f) < prompt_tokens:
        f //= 2
    return f


def batch(prompts: int, mini: int, n: int) -> tuple[int, int]:
    """(prompts per step, prompts per mini-batch) for the rehearsal's WORKERS workers: at most
    SAMPLES_PER_STEP samples (at least a prompt per worker), in the recipe's number of
    mini-batches where every worker still gets a prompt in each (the trainer's rule, config.py
    `validate`), else in as many as it allows."""
    updates = mini_batch_count(prompts, mini)
    budget = max(WORKERS, min(prompts, SAMPLES_PER_STEP // n))
    k = min(updates, budget // WORKERS)
    return budget // k * k, budget // k


def scale(cfg: Config, engine_importable: bool, prompt_tokens: int = 1) -> dict[str, Any]:
    """The rehearsal's settings that differ from the recipe's, by dotted key (the module's rule;
    `engine_importable`: whether the recipe's rollout engine is installed here, else the one that
    runs everywhere samples; `prompt_tokens`: the stand-in records' longest prompt; the stand-ins'
    paths and the run directory are the caller's)."""
    f = length_factor(cfg, prompt_tokens)
    out: dict[str, Any] = {k: -(-get(cfg, k) // f) for k in LENGTHS}  # a 0 ("off") stays 0
    out["fapo.genrm.max_tokens"] = min(out["fapo.genrm.max_tokens"], GENRM_TOKENS)
    if out["rollout.max_sequence_tokens"]:  # still room for a response after the longest prompt
        out["rollout.max_sequence_tokens"] = max(out["rollout.max_sequence_tokens"], out["data.max_prompt_length"] + 1)
    out["rollout.val_n"] = min(cfg.rollout.val_n, VAL_N)
    out["data.val_sets"] = [dataclasses.replace(v, n=min(v.n, VAL_N), k=[k for k in v.k if k <= VAL_N])
                            for v in cfg.data.val_sets]  # each set's samples, as rollout.val_n
    out["data.prompts_per_step"], out["optim.mini_batch_prompts"] = batch(
        cfg.data.prompts_per_step, cfg.optim.mini_batch_prompts, cfg.rollout.n)
    if cfg.data.gen_prompts_per_step:  # dynamic sampling's generation batch, in the recipe's proportion
        out["data.gen_prompts_per_step"] = -(-out["data.prompts_per_step"] * cfg.data.gen_prompts_per_step
                                             // cfg.data.prompts_per_step)
    out.update({"trainer.nnodes": 1, "trainer.workers_per_node": WORKERS, "trainer.cpus_per_worker": 1,
                "trainer.sharding": "fsdp", "model.compute_dtype": "bfloat16", "trainer.steps": STEPS,
                "trainer.save_every": 1, "trainer.resume": "auto", "trainer.ray_address": "",
                "trainer.progress": False})
    if not engine_importable:  # the engine that runs everywhere holds the whole model
        out["rollout.backend"], out["rollout.tensor_parallel_size"] = FALLBACK, 1
    else:  # as many engine ranks as the rehearsal has workers, at most
        out["rollout.tensor_parallel_size"] = min(cfg.rollout.tensor_parallel_size, WORKERS)
    # Ulysses sequence parallel over both workers where the recipe cuts its rows (trainer.offload kept)
    out["trainer.sequence_parallel_size"] = min(cfg.trainer.sequence_parallel_size, WORKERS)
    if cfg.trainer.placement == "split":  # one engine beside the two trainer workers (max_staleness kept)
        out["rollout.workers"] = 1
    if cfg.embedded_model:
        out["sft.steps"] = min(cfg.sft.steps, EMBEDDED_SFT_STEPS)
        out["data.train_size"] = min(cfg.data.train_size, EMBEDDED_TRAIN_SIZE)
        out["data.val_size"] = min(cfg.data.val_size, VAL_PROMPTS)
    return {k: v for k, v in out.items() if get(cfg, k) != v}


def apply(cfg: Config, settings: dict[str, Any]) -> Config:
    """`cfg` with `settings` (dotted keys), type-checked and validated as a loaded config is."""
    conf = OmegaConf.structured(cfg)
    for key, value in settings.items():
        OmegaConf.update(conf, key, value, merge=False)
    return validate(OmegaConf.to_object(conf))


# ---------------------------------------------------------------- the rehearsal


def real_model_config(cfg: Config):
    """(the transformers config of the recipe's model, where it was read); None for the embedded
    model, whose config the preflight builds from the model section."""
    from reasonrl_fast.layout.shape import model_fields
    from reasonrl_fast.models.stand_in import hf_config

    if cfg.embedded_model:
        return None, "the embedded model"
    fields, where, _ = model_fields(cfg.model.path, f"model.path={cfg.model.path!r}")
    return hf_config(fields), where


def rehearse(config: str, overrides: list[str], output_dir: str | None = None, log=print) -> dict:
    """Preflight the recipe at `config` (with `overrides`), then rehearse it scaled (module
    docstring); returns the resumed run's last metrics row."""
    from reasonrl_fast.data.stand_in import longest_prompt, records_for
    from reasonrl_fast.models import stand_in
    from reasonrl_fast.preflight import preflight
    from reasonrl_fast.trainer import stand_ins

    t0 = time.time()
    cfg = load_config(config, overrides)
    real, where = real_model_config(cfg)
    preflight(cfg, real, files=False)  # what stops the real run before Ray stops this one
    records = records_for(cfg, TRAIN_PROMPTS, VAL_PROMPTS)
    chat = any(isinstance(r["prompt"], list) for files in records.values() for _, pairs in files for r, _ in pairs)
    tok = stand_in.tokenizer(chat)
    prompt_tokens = longest_prompt(records, tok)
    scaled = scale(cfg, get_rollout(cfg.rollout.backend).available(), prompt_tokens)
    f = length_factor(cfg, prompt_tokens)
    work = os.path.abspath(output_dir) if output_dir else tempfile.mkdtemp(prefix="reasonrl-rehearse-")
    try:
        os.makedirs(work, exist_ok=True)
    except OSError as e:  # a file in its place, a parent that is a file, no permission
        why = "a file is there" if os.path.exists(work) else e.strerror
        raise RehearsalError(f"--output-dir {output_dir}: cannot be the rehearsal's directory ({why})") from None
    try:
        log(f"[rehearse] {config}: preflight passed against {where}; rehearsing in {work}")
        if "rollout.backend" in scaled:
            log(f"[rehearse] rollout: the recipe names {cfg.rollout.backend}, which is not importable here: "
                f"the {FALLBACK} rollout samples")
        spec = get_rollout(scaled.get("rollout.backend", cfg.rollout.backend))
        paths, notes = stand_ins.stage(cfg, work, records, tok, log,
                                       scaled.get("rollout.tensor_parallel_size", cfg.rollout.tensor_parallel_size),
                                       stand_ins.stand_in_head_dim(spec),
                                       scaled.get("trainer.sequence_parallel_size", cfg.trainer.sequence_parallel_size))
        settings = {**scaled, **_set_files(cfg, scaled, paths), "trainer.output_dir": os.path.join(work, "run")}
        if cfg.embedded_model:
            settings["sft.cache_dir"] = os.path.join(work, "sft")
        small = apply(cfg, {**settings, "trainer.overwrite": True})  # a rehearsal starts afresh
        for line in [f"lengths / {f} (prompt + response {cfg.max_sequence} -> {small.max_sequence} tokens)",
                     *notes, *(f"{k}: {get(cfg, k)!r} -> {v!r}" for k, v in scaled.items())]:
            log(f"[rehearse] {line}")
        preflight(small)  # as the train command runs it, on the stand-ins
        from reasonrl_fast.runtime.ray_cluster import start_ray, stop_ray
        from reasonrl_fast.trainer.loop import run

        t_run = time.time()
        lines: list[str] = []

        def keep(line) -> None:
            lines.append(str(line))
            log(line)

        owned = start_ray(small)  # one Ray instance for both runs (each would start its own)
        try:
            run(small, log)
            _check_learns(small)  # before the resumed run, which would not change the verdict
            last = run(apply(small, {"trainer.steps": STEPS + 1, "trainer.overwrite": False}), keep)
        finally:
            stop_ray(owned)
        if not any(line.startswith("resumed from ") for line in lines) or last.get("step") != STEPS + 1:
            raise RehearsalError(f"the second run did not resume from checkpoint-{STEPS} to step {STEPS + 1}")
        _check_learns(small)
        log(f"[rehearse] passed in {time.time() - t0:.0f}s ({time.time() - t_run:.0f}s in the trainer): "
            f"{STEPS} steps, checkpoint-{STEPS} resumed to step {STEPS + 1}; lengths / {f}, "
            f"{small.data.prompts_per_step} prompts x {small.rollout.n} a step in "
            f"{mini_batch_count(small.data.prompts_per_step, small.optim.mini_batch_prompts)} mini-batches")
    except BaseException:
        log(f"[rehearse] its files are kept in {work}")
        raise
    if not output_dir:
        shutil.rmtree(work, ignore_errors=True)
    return last


def _set_files(cfg: Config, scaled: dict, paths: dict) -> dict:
    """`paths` (stand_ins.stage's settings) with the validation sets' stand-in files
    ("data.val_sets[s].files") put into the sets themselves: one data.val_sets setting."""
    paths = dict(paths)
    sets = scaled.get("data.val_sets", cfg.data.val_sets)
    files = {s: paths.pop(f"data.val_sets[{s}].files") for s in range(len(sets)) if f"data.val_sets[{s}].files" in paths}
    if files:
        paths["data.val_sets"] = [dataclasses.replace(v, files=files.get(s, v.files)) for s, v in enumerate(sets)]
    return paths


def _check_learns(small: Config) -> None:
    """NothingLearned where the rehearsed run's metrics say nothing could learn."""
    from reasonrl_fast.util import read_metrics

    why = nothing_learns(read_metrics(small.trainer.output_dir), small.data.prompts_per_step * small.rollout.n)
    if why:
        raise NothingLearned(why)


def main(argv: list[str] | None = None) -> dict:
    try:
        return cli.main(_main, argv)
    except NothingLearned as e:  # it ran: no bad input, but a recipe that must not go to a cluster
        print(f"error: {cli.one_line(e)}", file=sys.stderr)
        raise SystemExit(1) from None


def _main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog="python -m reasonrl_fast.rehearse",
                                description="Rehearse a recipe on CPU in minutes (scaled down, run for real).")
    p.add_argument("config", help="the recipe (configs/*.yaml)")
    p.add_argument("overrides", nargs="*", help="key=value settings, applied before scaling")
    p.add_argument("--output-dir", help="keep the stand-in model, records and run here (default: a temporary "
                                        "directory, removed after a rehearsal that passes)")
    a = p.parse_intermixed_args(argv)  # key=value settings before, between or after the flags
    return rehearse(a.config, a.overrides, a.output_dir)


if __name__ == "__main__":
    main()
