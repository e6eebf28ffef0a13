"""Supervised warm start of the embedded tiny model on demonstrations of the built-in task (its
`demonstration`: noisy column additions; for data.task=genrm, right verdicts on such solutions), cached under
`sft.cache_dir/<hash of everything that shapes it>` so a second run (or a test) reuses it and a
changed config never picks up a stale one."""

from __future__ import annotations

import dataclasses
import math
import os
import random
import shutil
import time

import torch

from reasonrl_fast.config import config_hash
from reasonrl_fast.models.lm_head import decoder_of, head_of
from reasonrl_fast.models.tiny import char_tokenizer, tiny_context, tiny_model
from reasonrl_fast.ops import token_logprob
from reasonrl_fast.tasks import get_task
from reasonrl_fast.trainer.policy import make_batch
from reasonrl_fast.util import derive_seed

SFT_VERSION = 5  # bump when the supervised recipe or the saved tokenizer changes


def sft_cache_path(cfg) -> str:
    # The head's log-prob path, the RL update's checkpointing and compute dtype do not shape the
    # warm start: leaving them out keeps one cache for every setting (and the hash of configs
    # written before the keys existed).
    model = {k: v for k, v in dataclasses.asdict(cfg.model).items()
             if k not in ("fused_lm_head", "gradient_checkpointing", "compute_dtype")}
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
    # One thread: on a small shared CPU, OpenMP threads fighting for cores are slower than one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = char_tokenizer()
    model = tiny_model(cfg.model, len(tok), tok)
    if cfg.sft.steps:
        _train(model, tok, cfg, log)
    torch.set_num_threads(threads)
    tmp = f"{path}.tmp{os.getpid()}"
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):  # another process finished first
        shutil.rmtree(tmp)
    else:
        os.rename(tmp, path)
    return path


def _train(model, tok, cfg, log):
    rng = random.Random(derive_seed(cfg.trainer.seed, "warm start"))
    d = cfg.data
    demonstration = get_task(d.task).demonstration
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft.lr, weight_decay=0.0, betas=(0.9, 0.99))
    steps = cfg.sft.steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    model.train()
    t0 = time.time()
    for step in range(steps):
        prompts, responses = [], []
        for _ in range(cfg.sft.batch_size):
            prompt, response = demonstration(rng, d)
            prompts.append(tok(prompt)["input_ids"])
            responses.append(tok(response)["input_ids"] + [tok.eos_token_id])
        batch = make_batch(prompts, responses, tok.pad_token_id, "cpu")
        h = decoder_of(model)(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              position_ids=batch["position_ids"]).last_hidden_state
        logits = head_of(model)(h[:, batch["prompt_len"] - 1:-1])
        lp = token_logprob(logits, batch["targets"])
        loss = -(lp.sum() / batch["response_mask"].sum())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"[sft] step {step + 1}/{steps} loss {loss.item():.4f} ({time.time() - t0:.0f}s)")
    model.eval()
