"""TRL's side of bench_vs_trl.py, run by the Python of TRL's virtual environment:

    VENV/bin/python benchmarks/vs_trl_trl.py MODEL_DIR PROMPTS.jsonl OUT.json [--steps 10] [--threads 2]

GRPOTrainer on the model and prompts of vs_trl_task.py, with the settings our run uses (8 prompts
x 8 samples per step, 16 new tokens, temperature 1, no KL, lr 1e-4 constant, fp32, clip 0.2/0.28,
token-mean loss, AdamW betas 0.9/0.99, gradient clipping 1.0). TRL's fused LM head is always on
in 1.16; gradient checkpointing off, no vLLM, no reporting. The wall time of each optimiser step
(from one step's end to the next, the first from the start of training) goes to OUT.json."""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("prompts")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from vs_trl_task import trl_reward

    torch.set_num_threads(a.threads)
    rows = [json.loads(x) for x in open(a.prompts) if x.strip()]
    data = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    tok = PreTrainedTokenizerFast.from_pretrained(a.model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32, attn_implementation="sdpa")

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.t, self.times = 0.0, []

        def on_train_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            self.times.append(now - self.t)
            self.t = now

    times = StepTimes()
    with tempfile.TemporaryDirectory() as out_dir:
        cfg = GRPOConfig(
            output_dir=out_dir, per_device_train_batch_size=64, gradient_accumulation_steps=1,
            num_generations=8, max_completion_length=16, temperature=1.0, top_p=1.0, beta=0.0,
            learning_rate=1e-4, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            adam_beta1=0.9, adam_beta2=0.99, max_grad_norm=1.0, epsilon=0.2, epsilon_high=0.28,
            loss_type="dapo", num_iterations=1, max_steps=a.steps, logging_steps=1,
            save_strategy="no", report_to="none", use_vllm=False, gradient_checkpointing=False,
            bf16=False, fp16=False, use_cpu=True, dataloader_num_workers=0, seed=0,
            disable_tqdm=True)
        trainer = GRPOTrainer(model=model, reward_funcs=trl_reward, args=cfg, train_dataset=data,
                              processing_class=tok, callbacks=[times])
        trainer.train()
    json.dump({"step_s": times.times, "threads": a.threads}, open(a.out, "w"))


if __name__ == "__main__":
    main()
