"""reasonrl_fast: fused PyTorch ops for RL on reasoning, and a thin trainer built on them."""

__version__ = "0.1.0"
