"""`reasonrl_fast.merge` on the session's shared run: FSDP2 shards of a FlowRL checkpoint into a
Hugging Face directory that AutoModelForCausalLM loads, with the Z-head beside it."""

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl_fast.merge import load_model_tensors, merge
from reasonrl_fast.models.loading import load_tokenizer
from reasonrl_fast.models.tiny import char_tokenizer
from reasonrl_fast.ops import ZHead


def test_merge_round_trip(trained_run, tmp_path):
    merged = tmp_path / "merged"
    merge(str(trained_run.checkpoint), str(merged))
    model = AutoModelForCausalLM.from_pretrained(merged)
    tok = AutoTokenizer.from_pretrained(merged)
    sd = load_model_tensors(str(trained_run.checkpoint))
    for name, p in model.state_dict().items():
        torch.testing.assert_close(p, sd["lm." + name], rtol=0, atol=0)
    z = ZHead(model.config.hidden_size)
    z.load_state_dict(load_file(merged / "proj_z.safetensors"))
    for name, p in z.state_dict().items():
        torch.testing.assert_close(p, sd["proj_z." + name], rtol=0, atol=0)
    assert not any(k.startswith("proj_z") for k in model.state_dict())
    assert model.config.vocab_size == len(tok)  # no token the model lacks

    text = r"12+34= 4+2=6,1+3=4 \boxed{46}"
    assert load_tokenizer(str(merged))(text)["input_ids"] == char_tokenizer()(text)["input_ids"]
    ids = tok("12+34=", return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape[-1] == len(tok)
