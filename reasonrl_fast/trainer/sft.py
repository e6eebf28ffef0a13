"""Supervised warm start of the embedded tiny model on demonstrations of the built-in task (its
`demonstration`: noisy column additions; for data.task=genrm, right verdicts on such solutions), cached under
`sft.cache_dir/<hash of everything that shapes it>` so a second run (or a test) reuses it and a
changed config never picks up a stale one.

`train` is the one supervised loop: this warm start and the rehearsal's stand-in warm start
(trainer/stand_ins.py `teach_stand_in`) both run it, through the RL update's `Actor`, so a
supervised step computes its log-probs exactly as the RL update does."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Iterable

import torch

from reasonrl_fast.config import config_hash
from reasonrl_fast.models.tiny import char_tokenizer, tiny_context, tiny_model
from reasonrl_fast.tasks import get_task
from reasonrl_fast.trainer.policy import Actor, make_batch
from reasonrl_fast.util import derive_seed

SFT_VERSION = 5  # bump when the supervised recipe or the saved tokenizer changes


def sft_cache_path(cfg) -> str:
    # The head's log-prob path, the RL update's checkpointing and compute dtype do not shape the
    # warm start: leaving them out keeps one cache for every setting (and the hash of configs
    # written before the keys existed). Nor does the master dtype: the warm start trains and saves
    # float32 weights whatever model.dtype says, and the workers cast them as they load them.
    model = {k: v for k, v in dataclasses.asdict(cfg.model).items()
             if k not in ("fused_lm_head", "gradient_checkpointing", "compute_dtype", "dtype")}
    # the context the model is built with: an unset model.max_position_embeddings keys the cache
    # as its old default 256 did
    model["max_position_embeddings"] = tiny_context(cfg.model)
    parts = [model, cfg.sft.steps, cfg.sft.batch_size, cfg.sft.lr, cfg.data.digits, cfg.data.carry_slip_prob,
             cfg.data.carry_frac, cfg.data.flaw_prob, cfg.trainer.seed, SFT_VERSION]
    parts += get_task(cfg.data.task).sft_key(cfg.data)  # tasks with other demonstrations add to the key
    key = config_hash(*parts)
    return os.path.join(os.path.expanduser(cfg.sft.cache_dir), key)


def warm_start(cfg, log=print) -> str:
    """Path of the warm-started tiny model (training it first if it is not cached)."""
    path = sft_cache_path(cfg)
    if os.path.exists(os.path.join(path, "config.json")):
        log(f"[sft] using cached warm start {path}")
        return path
    torch.manual_seed(cfg.trainer.seed)
    with one_thread():
        tok = char_tokenizer()
        model = tiny_model(cfg.model, len(tok), tok)
        if cfg.sft.steps:
            _demonstrate(model, tok, cfg, log)
    tmp = f"{path}.tmp{os.getpid()}"
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.rename(tmp, path)
    except OSError:
        if not os.path.exists(os.path.join(path, "config.json")):
            raise
        shutil.rmtree(tmp)  # another process finished the same warm start first: its copy is used
    return path


@contextlib.contextmanager
def one_thread():
    """torch on one thread inside: on a small shared CPU, OpenMP threads fighting for cores are
    slower than one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train(model, batches: Callable[[int], dict], steps: int, lr: float, *,
          schedule: Callable[[int], float] | None = None, params: Iterable | None = None,
          clip: float | None = 1.0, log: Callable[[str], None] | None = None, every: int = 50) -> float:
    """`steps` supervised steps of the causal LM `model` on `batches(step)` (make_batch layout):
    the mean negative log-prob of the response tokens, through the RL update's `Actor`, AdamW at
    `lr` times `schedule(step)` (constant without one) over `params` (default: every parameter),
    gradients clipped to norm `clip` (None: not clipped). Logs the loss every `every` steps and
    at the last one when `log` is given; returns the last step's loss. The model is left in eval
    mode."""
    actor = Actor(model)
    opt = torch.optim.AdamW(model.parameters() if params is None else params, lr=lr, weight_decay=0.0,
                            betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule) if schedule else None
    model.train()
    t0, loss = time.time(), torch.tensor(float("nan"))
    for step in range(steps):
        batch = batches(step)
        lp, _, _ = actor(batch)
        loss = -(lp.sum() / batch["response_mask"].sum())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
        if log is not None and (step % every == 0 or step == steps - 1):
            log(f"[sft] step {step + 1}/{steps} loss {loss.item():.4f} ({time.time() - t0:.0f}s)")
    model.eval()
    return loss.item()


def _demonstrate(model, tok, cfg, log) -> None:
    """The embedded warm start: cfg.sft.steps steps on fresh batches of the task's
    demonstrations, the rate warmed up over 20 steps, then a cosine to 0."""
    rng = random.Random(derive_seed(cfg.trainer.seed, "warm start"))
    d = cfg.data
    demonstration = get_task(d.task).demonstration
    steps = cfg.sft.steps

    def batches(_step: int) -> dict:
        prompts, responses = [], []
        for _ in range(cfg.sft.batch_size):
            prompt, response = demonstration(rng, d)
            prompts.append(tok(prompt)["input_ids"])
            responses.append(tok(response)["input_ids"] + [tok.eos_token_id])
        return make_batch(prompts, responses, tok.pad_token_id, "cpu")

    train(model, batches, steps, cfg.sft.lr, log=log,
          schedule=lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps)))
