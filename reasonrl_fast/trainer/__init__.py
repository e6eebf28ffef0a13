"""The thin GRPO / FlowRL / FAPO trainer: `python -m reasonrl_fast.train` (see docs/trainer.md).

loop.py (the training loop, top to bottom), cluster.py (the workers on Ray), worker.py (one
rank: FSDP2 shard, optimiser, rollout engine, the step's samples), policy.py (LM + Z-head, batch
layout, mini-batches), fsdp.py, sft.py (the embedded model's cached warm start), fapo.py (the
GenRM judge in the loop), logger.py. It stands on runtime/ (Ray, checkpoints, datasets), algos/,
tasks/, rollout/, rewards/, models/ and config.py."""
