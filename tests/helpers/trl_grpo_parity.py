"""Runs inside the TRL venv: the same tiny GRPO run (tests/helpers/trl_child.py's Qwen2, same
seed, same data) twice, once with TRL's own code and once with reasonrl_fast.integrations.trl
patched in, and prints both runs' logged metrics; in fp32, the same for short SFT and KTO runs,
whose fused heads ask for more: `is_top1` (SFT's token accuracy; the ops do not compute it, TRL's
head does) and `mean_logits` (KTO's logits/* metrics; computed beside the ops).

    python trl_grpo_parity.py fp32|bf16 STEPS

bf16: bf16 mixed precision (autocast on CPU), as `GRPOConfig(bf16=True)` gives it. The script
also measures plain PyTorch's own error in that precision, to size the test's tolerance: the
tiny model's per-token log-probs and entropies through its ordinary head (bf16 autocast, then
float32 log_softmax) against the same model in float64.

The optimiser is plain SGD: AdamW's first step moves every parameter by lr * sign(gradient), so a
gradient that is zero up to rounding on one side and not on the other would move a parameter by
a whole learning rate; SGD keeps parameter differences proportional to gradient differences.

Prints one JSON object after the line "@@result@@" (this script asserts nothing)."""

from __future__ import annotations

import json
import sys
import tempfile

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer, KTOConfig, KTOTrainer, SFTConfig, SFTTrainer

from reasonrl_fast.integrations import trl as rf_trl
from reasonrl_fast.models.tiny import char_tokenizer
from tests.helpers.trl_child import OpCounter, WarningLog, tiny_model


def reward_digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def grpo(model_dir: str, out_dir: str, tok, steps: int, bf16: bool) -> list[dict]:
    data = Dataset.from_dict({"prompt": ["1+1=", "2+3=", "7+1=", "4+4="] * 4})
    args = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, max_steps=steps, learning_rate=0.05, optim="sgd",
                      beta=0.04, use_vllm=False, report_to=[], bf16=bf16, use_cpu=True,
                      logging_steps=1, save_strategy="no", seed=0, temperature=0.9,
                      dataloader_num_workers=0)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward_digits, args=args,
                          train_dataset=data, processing_class=tok)
    trainer.train()
    return [r for r in trainer.state.log_history if "loss" in r]


def sft(model_dir: str, out_dir: str, tok, steps: int, bf16: bool) -> list[dict]:
    data = Dataset.from_dict({"text": [f"{a}+{b}={a + b}" for a in range(6) for b in range(4)]})
    args = SFTConfig(output_dir=out_dir, per_device_train_batch_size=4, max_steps=steps,
                     learning_rate=0.05, optim="sgd", max_length=16, report_to=[], bf16=bf16,
                     use_cpu=True, logging_steps=1, save_strategy="no", seed=0,
                     dataloader_num_workers=0)
    trainer = SFTTrainer(model=model_dir, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    return [r for r in trainer.state.log_history if "loss" in r]


def kto(model_dir: str, out_dir: str, tok, steps: int, bf16: bool) -> list[dict]:
    pairs = [(f"{a}+{b}=", str(a + b), str(a * b + 1)) for a in range(4) for b in range(3)]
    data = Dataset.from_dict({"prompt": [p for p, _, _ in pairs] * 2,
                              "completion": [g for _, g, _ in pairs] + [w for _, _, w in pairs],
                              "label": [True] * len(pairs) + [False] * len(pairs)})
    args = KTOConfig(output_dir=out_dir, per_device_train_batch_size=4, max_steps=steps,
                     learning_rate=0.05, optim="sgd", report_to=[], bf16=bf16, use_cpu=True,
                     logging_steps=1, save_strategy="no", seed=0, dataloader_num_workers=0)
    trainer = KTOTrainer(model=model_dir, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    return [r for r in trainer.state.log_history if "loss" in r]


def plain_error(model_dir: str) -> dict:
    """Plain PyTorch's error in bf16 autocast vs float64 on the tiny model: per-token log-probs
    and entropies (largest absolute error), and the gradient of their sum (relative error of
    the whole gradient, which bounds the relative error of its norm)."""
    from transformers import AutoModelForCausalLM
    ids = torch.randint(3, char_tokenizer().vocab_size, (16, 12),
                        generator=torch.Generator().manual_seed(5))
    out = {}
    for name in ("bf16", "fp64"):
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        if name == "fp64":
            model = model.double()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "bf16"):
            z = model(input_ids=ids).logits.double() / 0.9
        lsm = z.log_softmax(-1)
        lp = lsm[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
        ent = -(lsm.exp() * lsm).sum(-1)[:, :-1]
        (lp.sum() + ent.sum()).backward()
        grad = torch.cat([q.grad.double().flatten() for q in model.parameters()])
        out[name] = (lp.detach(), ent.detach(), grad)
    (lp16, ent16, g16), (lp64, ent64, g64) = out["bf16"], out["fp64"]
    return {"lp": (lp16 - lp64).abs().max().item(), "entropy": (ent16 - ent64).abs().max().item(),
            "grad_rel": ((g16 - g64).norm() / g64.norm()).item()}


def main() -> None:
    mode, steps = sys.argv[1], int(sys.argv[2])
    bf16 = mode == "bf16"
    tok = char_tokenizer()
    warnings = WarningLog().messages
    result: dict = {"mode": mode}
    with tempfile.TemporaryDirectory() as tmp:
        tiny_model(tok, 0).save_pretrained(f"{tmp}/model")
        tok.save_pretrained(f"{tmp}/model")
        result["trl"] = grpo(f"{tmp}/model", f"{tmp}/trl", tok, steps, bf16)
        counter = OpCounter()
        with rf_trl.patch(), counter:
            result["patched"] = grpo(f"{tmp}/model", f"{tmp}/patched", tok, steps, bf16)
        result["calls"] = dict(counter.calls)
        result["grpo_warnings"] = list(warnings)
        for name, run in () if bf16 else (("sft", sft), ("kto", kto)):
            result[f"{name}_trl"] = run(f"{tmp}/model", f"{tmp}/{name}_trl", tok, 2, bf16)
            counter = OpCounter()
            with rf_trl.patch(), counter:
                result[f"{name}_patched"] = run(f"{tmp}/model", f"{tmp}/{name}_p", tok, 2, bf16)
            result[f"{name}_calls"] = dict(counter.calls)
        if bf16:
            result["plain_error"] = plain_error(f"{tmp}/model")
    result["warnings"] = warnings
    print("@@result@@\n" + json.dumps(result))


if __name__ == "__main__":
    main()
