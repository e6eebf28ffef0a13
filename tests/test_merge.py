"""`reasonrl_fast.merge` on the session's shared run: FSDP2 shards of a FlowRL checkpoint into a
Hugging Face directory that AutoModelForCausalLM loads, with the Z-head beside it; and, on a
one-process checkpoint of the tiny model, which of the checkpoint's files merge reads."""

import json
import os
import random
import re
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl_fast.runtime.merge import load_model_tensors, merge
from reasonrl_fast.models.loading import load_tokenizer
from reasonrl_fast.models.tiny import char_tokenizer
from reasonrl_fast.ops import ZHead
from reasonrl_fast.runtime import checkpoint as ckpt
from reasonrl_fast.config import load_config
from reasonrl_fast.models.tiny import tiny_model


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


def tiny_checkpoint(out):
    """checkpoint-1 of the tiny model as one process saves it: DCP shards, an RNG file, and
    hf/ with the real tokenizer and config."""
    tok = char_tokenizer()
    model = tiny_model(load_config(None, []).model, len(tok), tok)
    tmp = ckpt.tmp_path(str(out), 1)
    dcp.save({"model": {f"lm.{k}": v for k, v in model.state_dict().items()}}, checkpoint_id=tmp, no_dist=True)
    ckpt.save_rng(tmp, 0, torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))]),
                                                            lambda s: 1.0))
    state = ckpt.TrainState(1, "r", 1, {"epoch": 0, "pos": 0}, random.getstate())
    return model, ckpt.finalize(tmp, state, tok, model.config, 0)


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_merge_reads_only_the_listed_tokenizer_and_config(tmp_path):
    model, path = tiny_checkpoint(tmp_path / "run")
    listed = [rel for rel in ckpt.read_state(path)["files"] if rel.startswith("hf/")]
    assert "hf/config.json" in listed and "hf/tokenizer.json" in listed
    # files the save did not write, which transformers would open by name: a link to a file
    # outside the checkpoint (its text would become the merged model's chat template), a FIFO.
    # Merge loads from a copy of the listed files only.
    secret = tmp_path / "secret.txt"
    secret.write_text("not the checkpoint's {{ messages }}")
    os.symlink(secret, os.path.join(path, "hf", "chat_template.jinja"))
    os.mkfifo(os.path.join(path, "hf", "added_tokens.json"))
    merge(path, str(tmp_path / "merged"), trust=True)
    assert not any("not the checkpoint's" in p.read_text() for p in (tmp_path / "merged").iterdir() if p.is_file()
                   and p.suffix != ".safetensors")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    for name, p in merged.state_dict().items():
        torch.testing.assert_close(p, model.state_dict()[name], rtol=0, atol=0)
    text = "12+34=46"
    assert load_tokenizer(str(tmp_path / "merged"))(text)["input_ids"] == char_tokenizer()(text)["input_ids"]


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_crafted_config_is_named_and_nothing_is_written(tmp_path):
    """hf/config.json comes from the checkpoint, which could hold anything (its size and checksum
    recorded to match): a config transformers cannot build, or one that does not fit the weights,
    is a CheckpointError naming the file, raised before the output directory is made. (The CLI
    cases: tests/test_cli_sweep.py.)"""
    _, path = tiny_checkpoint(tmp_path / "run")
    config = os.path.join(path, "hf", "config.json")
    good = json.loads(open(config).read())
    for text, says in [("[" * 100_000, r"not valid JSON \(nested too deeply\)"),
                       (json.dumps({**good, "hidden_size": "abc"}), r"not a model config transformers can build"),
                       (json.dumps({**good, "hidden_size": 2 * good["hidden_size"]}),
                        r"does not describe the checkpoint's weights")]:
        with open(config, "w") as f:
            f.write(text)
        state = ckpt.read_state(path)
        (size, crc), = ckpt.checksums(path, ["hf/config.json"]).values()
        state["files"]["hf/config.json"], state["checksums"]["hf/config.json"] = size, crc
        with open(os.path.join(path, ckpt.STATE), "w") as f:
            json.dump(state, f)
        with pytest.raises(ckpt.CheckpointError, match=rf"{re.escape(config)}:? {says}"):
            merge(path, str(tmp_path / "merged"))
        assert not (tmp_path / "merged").exists()
