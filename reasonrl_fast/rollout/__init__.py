"""Generation engines behind one interface, by name (registry.py `ROLLOUTS`): `hf` (a Hugging
Face model sampled with its KV cache, hf.py: everywhere) and `vllm` (a colocated vLLM engine,
vllm.py: GPU or CPU). An engine is two classes in its module: its spec (`EngineSpec`, registry.py:
the facts, the memory the planner counts, and `build`) and the `Engine` it builds (base.py), which
samples; throughout the project the one is called `spec` and the other `engine`. A rollout worker
(worker.py `RolloutWorker`) holds one engine: the eval command's actors are rollout workers, and
the trainer's workers extend them with the update. Every engine gives each sample its own seed and
reports the sampler's log-prob of every token.

Importing the package loads neither torch nor an engine: the specs are asked on machines without
them (the planner, the config checks), and an engine is imported when built."""

from __future__ import annotations

from reasonrl_fast.rollout.base import Engine, Samples, sample_seed, sample_seeds
from reasonrl_fast.rollout.registry import ROLLOUTS, EngineMemory, EngineSpec, MemoryTerm, get_rollout

__all__ = ["ROLLOUTS", "Engine", "EngineMemory", "EngineSpec", "MemoryTerm", "Samples", "get_rollout", "sample_seed",
           "sample_seeds"]
