"""`python -m reasonrl_fast.merge RUN_DIR/checkpoint-N OUT_DIR`

Turns a sharded torch.distributed.checkpoint into a Hugging Face model directory (safetensors,
config, tokenizer) that loads with AutoModelForCausalLM, plus `proj_z.safetensors` (the FlowRL
Z-head, keys `net.0.weight`, ...) beside it. Runs in one process, no GPU or process group."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file


def load_model_tensors(ckpt: str) -> dict[str, torch.Tensor]:
    """Every `model.*` tensor of the checkpoint, unsharded (DCP reshards on load)."""
    md = dcp.FileSystemReader(ckpt).read_metadata()
    state = {}
    for key, meta in md.state_dict_metadata.items():
        if key.startswith("model.") and hasattr(meta, "size"):
            state[key] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
    dcp.load(state, checkpoint_id=ckpt, no_dist=True)
    return {k[len("model."):]: v for k, v in state.items()}


def merge(ckpt: str, out_dir: str) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    from reasonrl_fast.trainer.model import load_tokenizer

    hf = os.path.join(ckpt, "hf")
    if not os.path.exists(os.path.join(ckpt, "trainer_state.json")):
        raise FileNotFoundError(f"{ckpt} is not a complete checkpoint (no trainer_state.json)")
    tensors = load_model_tensors(ckpt)
    lm_sd = {k[len("lm."):]: v for k, v in tensors.items() if k.startswith("lm.")}
    z_sd = {k[len("proj_z."):]: v.contiguous() for k, v in tensors.items() if k.startswith("proj_z.")}
    config = AutoConfig.from_pretrained(hf)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(lm_sd, strict=True, assign=True)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    load_tokenizer(hf).save_pretrained(out_dir)
    if z_sd:
        save_file(z_sd, os.path.join(out_dir, "proj_z.safetensors"))
    return out_dir


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.exit("usage: python -m reasonrl_fast.merge RUN_DIR/checkpoint-N OUT_DIR")
    print(merge(*argv))


if __name__ == "__main__":
    main()
