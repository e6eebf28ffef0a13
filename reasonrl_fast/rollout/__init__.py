"""Generation engines behind one interface (engines.py): `hf` (Hugging Face generate, everywhere)
and `vllm` (a colocated engine, GPU). Used by the trainer's workers and the eval command."""

from reasonrl_fast.rollout.engines import HFRollout, RolloutEngine, VLLMRollout, make_rollout

__all__ = ["HFRollout", "RolloutEngine", "VLLMRollout", "make_rollout"]
