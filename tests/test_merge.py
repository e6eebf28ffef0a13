"""`reasonrl_fast.merge` on the session's shared run: FSDP2 shards of a FlowRL checkpoint into a
Hugging Face directory that AutoModelForCausalLM loads, with the Z-head beside it."""

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl_fast.runtime.merge import load_model_tensors, merge
from reasonrl_fast.models.loading import load_tokenizer
from reasonrl_fast.models.tiny import char_tokenizer
from reasonrl_fast.ops import ZHead
from reasonrl_fast.runtime import checkpoint as ckpt


def test_merge_round_trip(trained_run, tmp_path):
    merged = tmp_path / "merged"
    merge(str(trained_run.checkpoint), str(merged))
    model = AutoModelForCausalLM.from_pretrained(merged)
    tok = AutoTokenizer.from_pretrained(merged)
    sd = load_model_tensors(str(trained_run.checkpoint))
    for name, p in model.state_dict().items():
        torch.testing.assert_close(p, sd["lm." + name], rtol=0, atol=0)
    z = ZHead(model.config.hidden_size)
    z.load_state_dict(load_file(merged / "zhead" / "proj_z.safetensors"))
    assert sorted(p.name for p in merged.glob("*.safetensors")) == ["model.safetensors"]  # vLLM loads them all
    for name, p in z.state_dict().items():
        torch.testing.assert_close(p, sd["proj_z." + name], rtol=0, atol=0)
    assert not any(k.startswith("proj_z") for k in model.state_dict())
    assert model.config.vocab_size == len(tok)  # no token the model lacks

    text = r"12+34= 4+2=6,1+3=4 \boxed{46}"
    assert load_tokenizer(str(merged))(text)["input_ids"] == char_tokenizer()(text)["input_ids"]
    ids = tok("12+34=", return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape[-1] == len(tok)


def test_a_real_checkpoint_is_checked_by_content(trained_run, tmp_path):
    """The save recorded a checksum per file; a byte changed inside a shard's tensor data (the
    size stays, torch would read it) is named by merge instead of being merged."""
    state = ckpt.read_state(str(trained_run.checkpoint))
    assert sorted(state["checksums"]) == sorted(state["files"])
    assert ckpt.defects(str(trained_run.checkpoint)) == []
    copy = tmp_path / "checkpoint-2"
    shutil.copytree(trained_run.checkpoint, copy)
    shard = max((p for p in copy.iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)
    with open(shard, "r+b") as f:
        f.seek(shard.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x01]))
    with pytest.raises(ckpt.CheckpointError, match=rf"{shard.name} \(damaged"):
        merge(str(copy), str(tmp_path / "merged"))
