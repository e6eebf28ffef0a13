"""The CPU rehearsal's stand-ins on disk (reasonrl_fast/rehearse.py): the stand-in records
(data/stand_in.py) written as record files, the policy model (models/stand_in.py: the recipe
model's architecture, small and random) warm-started on the records' reference responses through
the one supervised loop (trainer/sft.py `train`), and a random GenRM of the recipe's GenRM
architecture for our server's hf backend. `stage` writes them and says which settings point a
run at them; the rehearsal's scaling rule decides nothing here."""

from __future__ import annotations

import os
import time
from typing import Any

from reasonrl_fast.redact import redact_value

WARM_STEPS, WARM_LR, WARM_WIDTH = 30, 1e-2, 80
"""The stand-in model's warm start: enough for about a quarter of its answers to be right. The
rate is WARM_LR up to WARM_WIDTH hidden units and falls as 1/width beyond (Adam's steps move each
weight alike, so a wider layer's output moves more): at 1e-2 the 320-wide stand-in a TP-2 vLLM
engine gets was still at loss 0.9 after 30 steps and sampled no right answer; at 2.5e-3 it is
below 0.1 by step 20, as the 80-wide one is at 1e-2."""
GENRM_SHAPE = "Qwen3-4B-Instruct-2507"
"""The architecture of the GenRM a FAPO recipe asks at remote addresses: FAPO's GenRM is trained
from it (configs/fapo_genrm_qwen3_4b.yaml)."""


def stand_in_head_dim(spec) -> int:
    """The stand-in's head size: stand_in.HEAD_DIM, or the smallest above it that the rehearsal's
    rollout engine (its spec, rollout/registry.py) can run on CPU (vLLM's CPU attention starts at 32)."""
    from reasonrl_fast.models import stand_in

    dims = spec.cpu_head_dims
    return stand_in.HEAD_DIM if not dims or stand_in.HEAD_DIM in dims else min(
        d for d in dims if d > stand_in.HEAD_DIM)


def stand_in_genrm(cfg) -> bool:
    """Whether the run's GenRM is replaced by a stand-in: a FAPO recipe whose GenRM is a model
    (remote replicas, or a model directory its own server loads: `local_model`), not a rule
    judge."""
    from reasonrl_fast.algos import get_algo

    g = cfg.fapo.genrm
    return get_algo(cfg.algo).uses_genrm and (bool(g.addresses) or g.local_model is not None)


def stage(cfg, work: str, records: dict, tok, log, tensor_parallel: int = 1,
          head_dim: int | None = None, sequence_parallel: int = 1) -> tuple[dict[str, Any], list[str]]:
    """Write the stand-ins the recipe needs into `work`: `records` (data/stand_in.py
    `records_for`), the policy model (warm-started, shaped for the rehearsal's rollout and update:
    heads `tensor_parallel` engine ranks and `sequence_parallel` Ulysses ranks split, `head_dim`
    wide, default stand_in.HEAD_DIM) and the GenRM model. Returns the settings that point the run at them, and a line on each."""
    from reasonrl_fast.data.prepare import write_records
    from reasonrl_fast.genrm.backends import backend_spec
    from reasonrl_fast.models import stand_in
    from reasonrl_fast.layout.shape import model_fields

    settings: dict[str, Any] = {}
    notes: list[str] = []
    pairs: list[tuple[dict, str]] = []
    for key, files in records.items():
        for i, (path, recs) in enumerate(files):
            name = key.split(".")[1].replace("[", "-").replace("]", "")  # train_files, val_sets-0, ...
            out = os.path.join(work, "data", f"{name}-{i}.jsonl")
            write_records([r for r, _ in recs], out)
            settings.setdefault(key, []).append(out)
            pairs += recs
            sources = ", ".join(repr(s) for s in dict.fromkeys(r["data_source"] for r, _ in recs))
            notes.append(f"{key}: {path} -> {len(recs)} stand-in {sources} records")
    if not cfg.embedded_model:
        fields, where, _ = model_fields(cfg.model.path, f"model.path={cfg.model.path!r}")
        small = stand_in.shrink(fields, tensor_parallel, head_dim or stand_in.HEAD_DIM, sequence_parallel)
        path = os.path.join(work, "model", os.path.basename(os.path.normpath(cfg.model.path)))
        stand_in.build(small, path, tok, cfg.trainer.seed)
        teach_stand_in(path, pairs, log)
        settings["model.path"] = path
        notes.append(f"model: {where} -> {describe(small)}, random, warm-started {WARM_STEPS} steps")
    if stand_in_genrm(cfg):
        g = cfg.fapo.genrm
        fields, where, _ = (model_fields(GENRM_SHAPE, "the GenRM") if g.addresses else
                            model_fields(g.local_model, f"fapo.genrm.serve={g.serve!r}"))
        small = stand_in.shrink(fields)
        # the client asks for fapo.genrm.model; our server serves its directory's name
        path = stand_in.build(small, os.path.join(work, g.model or "genrm"), stand_in.tokenizer(False),
                              cfg.trainer.seed + 1)
        settings.update({"fapo.genrm.addresses": [], "fapo.genrm.serve": backend_spec("hf", path)})
        notes.append(f"GenRM: {', '.join(redact_value('fapo.genrm.addresses', g.addresses)) or g.serve} -> "
                     f"our server's hf backend on a random "
                     f"{describe(small)} ({where})")
    return settings, notes


def describe(fields: dict) -> str:
    return (f"{fields['model_type']} {fields['num_hidden_layers']} layers x {fields['hidden_size']} "
            f"({fields['num_attention_heads']}:{fields.get('num_key_value_heads') or fields['num_attention_heads']} "
            f"heads, vocabulary {fields['vocab_size']}{', tied' if fields.get('tie_word_embeddings') else ''})")


def teach_stand_in(path: str, pairs: list[tuple[dict, str]], log) -> None:
    """WARM_STEPS supervised steps (trainer/sft.py `train`, the embedded warm start's loop) of the
    stand-in model at `path` on the records' reference responses (prompts rendered as the trainer
    renders them), all in one batch, at a constant rate, unclipped; saved in place. An untied
    input embedding stays as initialised: the real vocabulary's table is half the model, and the
    layers and the head learn the few answers without it."""
    import torch
    from transformers import AutoModelForCausalLM

    from reasonrl_fast.data.records import prompt_ids
    from reasonrl_fast.models.loading import load_tokenizer
    from reasonrl_fast.trainer.policy import make_batch
    from reasonrl_fast.trainer.sft import one_thread, train

    t0 = time.time()
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    seqs = dict.fromkeys((tuple(prompt_ids(r, tok)), tuple(tok(resp, add_special_tokens=False)["input_ids"]))
                         for r, resp in pairs)  # the records repeat a few problems
    batch = make_batch([list(p) for p, _ in seqs], [[*r, tok.eos_token_id] for _, r in seqs], tok.pad_token_id, "cpu")
    if not model.config.tie_word_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)
    lr = WARM_LR * min(1.0, WARM_WIDTH / model.config.hidden_size)
    with one_thread():
        loss = train(model, lambda _: batch, WARM_STEPS, lr, clip=None,
                     params=[p for p in model.parameters() if p.requires_grad])
        model.save_pretrained(path)
    log(f"[rehearse] warm start: {WARM_STEPS} steps at lr {lr:.2g} on {len(seqs)} prompts, loss {loss:.3f} "
        f"({time.time() - t0:.0f}s)")
