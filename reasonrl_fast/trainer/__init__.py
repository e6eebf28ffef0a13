"""The thin GRPO / FlowRL / FAPO trainer: `python -m reasonrl_fast.train` (see docs/trainer.md).

config.py (dataclasses + OmegaConf), data.py (datasets, sampler), sft.py (cached warm start),
algos.py (losses, reward shaping), fapo.py (the GenRM judge in the loop), policy.py (LM + Z-head,
batch layout), fsdp.py, worker.py (Ray actor), cluster.py (placement), checkpoint.py, logger.py,
reaper.py, loop.py (the training loop). Below it: data/ (tasks), models/, rollout/, rewards/,
genrm/."""
