"""Merging a sharded trainer checkpoint into a Hugging Face model directory (safetensors, config,
tokenizer) that loads with AutoModelForCausalLM, plus `zhead/proj_z.safetensors` (the FlowRL
Z-head, keys `net.0.weight`, ...) in a folder of its own: a loader that reads every top-level
`*.safetensors` file as the model's (vLLM does) must not meet it. One process, no GPU or process group. Used by the merge
command and by eval on a checkpoint.

A checkpoint directory is trusted input, like any PyTorch checkpoint: torch.distributed.checkpoint's
`.metadata` is a pickle, and loading it can run code. A checkpoint that other users could have
written to is refused unless trusted, and one with a missing or damaged file (its size or CRC-32
differs from what the save recorded, or it is not a regular file) is refused naming the file.
The config and tokenizer are read from a copy made through checkpoint.read_trusted."""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.api import CheckpointException

from reasonrl_fast.errors import UserError, one_line
from reasonrl_fast.models import LM_PREFIX, ZHEAD_PREFIX
from reasonrl_fast.runtime import checkpoint
from reasonrl_fast.util import loads_json

ZHEAD_DIR = "zhead"  # the Z-head's folder in a merged model directory


def load_model_tensors(ckpt: str) -> dict[str, torch.Tensor]:
    """Every `model.*` tensor of the checkpoint, unsharded (DCP reshards on load). A file DCP
    cannot read (in a checkpoint too old to have checksums) is a CheckpointError."""
    try:
        md = dcp.FileSystemReader(ckpt).read_metadata()
        state = {}
        for key, meta in md.state_dict_metadata.items():
            if key.startswith("model.") and hasattr(meta, "size"):
                state[key] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        dcp.load(state, checkpoint_id=ckpt, no_dist=True)
    # unpickling garbage fails in any way (IndexError, ...); DCP's own error is a BaseException
    except (Exception, CheckpointException) as e:  # noqa: BLE001
        raise checkpoint.unreadable(ckpt, e) from None
    return {k[len("model."):]: v for k, v in state.items()}


def check_checkpoint(ckpt: str, trust: bool, trust_hint: str = "--trust-checkpoint", name: str = "") -> None:
    """CheckpointError unless `ckpt` is complete, undamaged and, without `trust`, written by no one
    but us; the messages name it as `name` (default: the path) and the setting that overrides trust."""
    bad = checkpoint.defects(ckpt, warn=lambda m: print(m, file=sys.stderr))
    if bad:
        raise checkpoint.CheckpointError(f"{name or ckpt} is not a complete, undamaged checkpoint; "
                                         f"missing or damaged: {', '.join(bad)}")
    if not trust:
        checkpoint.check_trusted(ckpt, trust_hint)


def copy_hf(ckpt: str, dest: str) -> None:
    """The config and tokenizer files trainer_state.json lists under hf/, copied into `dest`
    through checkpoint.read_trusted (each capped at its listed size), so that transformers, which
    opens files by name, reads our copy and never a FIFO, a device or a link of the checkpoint,
    nor a file the save did not write."""
    files, _ = checkpoint.file_list(checkpoint.read_state(ckpt))
    for rel, size in files.items():
        if rel.startswith("hf/"):
            with open(os.path.join(dest, rel[len("hf/"):]), "wb") as f:
                f.write(checkpoint.read_trusted(ckpt, rel, size))


def build_model(hf: str, ckpt: str, lm_sd: dict[str, torch.Tensor]):
    """The model the checkpoint's config describes (read from `hf`, the copy of its hf/), holding
    `lm_sd`. A config that is no model config transformers can build (not JSON, nested too deeply,
    no or an unknown model_type, a field of the wrong type or out of range) or that does not fit
    the weights is a CheckpointError naming the checkpoint's file: merge reads it from a
    checkpoint, which could hold anything."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig, AutoModelForCausalLM

    where = os.path.join(ckpt, "hf", "config.json")
    try:
        with open(os.path.join(hf, "config.json"), "rb") as f:
            raw = loads_json(f.read())
    except OSError as e:
        raise checkpoint.CheckpointError(f"{where}: cannot be read ({e.strerror or e})") from None
    except ValueError as e:  # JSONDecodeError, not UTF-8, nested too deeply
        raise checkpoint.CheckpointError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise checkpoint.CheckpointError(f"{where}: expected a JSON object (a model config), got "
                                         f"{type(raw).__name__}")
    try:
        config = AutoConfig.from_pretrained(hf)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    # transformers' own for a bad config: ValueError (model_type), OSError (not JSON), the strict
    # dataclasses' checks of each field, TypeError/KeyError/AttributeError from a value of the
    # wrong kind, RecursionError from a value nested too deeply
    except (ValueError, TypeError, KeyError, AttributeError, OSError, RecursionError, StrictDataclassError) as e:
        why = one_line(e).replace(hf, os.path.join(ckpt, "hf"))[:400]
        raise checkpoint.CheckpointError(f"{where}: not a model config transformers can build "
                                         f"({type(e).__name__}: {why})") from None
    try:
        model.load_state_dict(lm_sd, strict=True, assign=True)
    except RuntimeError as e:  # missing, unexpected or differently shaped weights
        why = one_line(e)[:400]
        raise checkpoint.CheckpointError(f"{where} does not describe the checkpoint's weights ({why})") from None
    return model


def merge(ckpt: str, out_dir: str, trust: bool = False) -> str:
    from reasonrl_fast.models.loading import load_tokenizer

    check_checkpoint(ckpt, trust)
    tensors = load_model_tensors(ckpt)
    lm_sd = {k[len(LM_PREFIX):]: v for k, v in tensors.items() if k.startswith(LM_PREFIX)}
    z_sd = {k[len(ZHEAD_PREFIX):]: v.contiguous() for k, v in tensors.items() if k.startswith(ZHEAD_PREFIX)}
    # kept until the tokenizer is saved: a tokenizer may copy its files from where it was loaded
    with tempfile.TemporaryDirectory(prefix="reasonrl_hf_") as hf:
        copy_hf(ckpt, hf)
        model = build_model(hf, ckpt, lm_sd)  # before out_dir is made: a refused config writes nothing
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            raise UserError(f"output directory {out_dir}: cannot be created ({e.strerror}: {e.filename})") from None
        model.save_pretrained(out_dir, safe_serialization=True)
        load_tokenizer(hf, f"{ckpt}/hf").save_pretrained(out_dir)
    if z_sd:
        os.makedirs(os.path.join(out_dir, ZHEAD_DIR), exist_ok=True)
        save_file(z_sd, os.path.join(out_dir, ZHEAD_DIR, "proj_z.safetensors"))
    return out_dir
