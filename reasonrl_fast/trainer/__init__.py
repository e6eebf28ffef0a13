"""The thin GRPO / FlowRL / FAPO trainer: `python -m reasonrl_fast.train` (see docs/trainer.md).

loop.py (the training loop, top to bottom), cluster.py (the workers on Ray), worker.py (one
rank: FSDP2 shard, optimiser, rollout engine, the step's samples), update.py (a worker's update
of one mini-batch as micro-batches: their plan, tensors and gradient accumulation), policy.py (LM + Z-head,
batch layout), fsdp.py (sharding, replication, the weight gather), optim.py (the optimiser),
schedule.py (the learning-rate schedule), sft.py (the embedded model's cached warm start),
fapo.py (the GenRM judge in the loop), logger.py (the metrics sinks). It stands on runtime/
(Ray, checkpoints, datasets), algos/, tasks/, rollout/, rewards/, models/, layout/ (the run's shape and its
mini- and micro-batches) and config/."""
