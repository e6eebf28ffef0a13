"""The thin GRPO / FlowRL trainer: `python -m reasonrl_fast.train` (see docs/trainer.md).

config.py (dataclasses + OmegaConf), data.py (synthetic task, jsonl/parquet), model.py (tiny
Qwen2, char tokenizer), sft.py (cached warm start), reward.py, algos.py (losses), policy.py
(LM + Z-head, batch layout), fsdp.py, rollout.py (hf / vllm), worker.py (Ray actor),
cluster.py (placement), checkpoint.py, logger.py, loop.py (the training loop)."""
