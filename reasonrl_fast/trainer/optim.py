"""The policy's optimizer: torch's AdamW, or with bf16 master weights and
`optim.bf16_stochastic_round` torchao's AdamW, which rounds each new weight to bf16 stochastically
so that a step below bf16's spacing still moves it in expectation (docs/trainer.md, Memory:
Precision; the rule that asks for it is config/validate.py `check_bf16_lr`)."""

from __future__ import annotations

import torch

from reasonrl_fast.errors import ConfigError

# torchao is an extra of its own, not part of "train": once installed, transformers imports it in
# every process that loads a model, and on a CPU torch its import logs that its CUDA kernels do
# not load (setup.py).
TORCHAO_HINT = "pip install 'reasonrl_fast[bf16]' (torchao>=0.18)"


def stochastic_adamw():
    """torchao's AdamW class (0.18 exports it as `_AdamW`: a copy of torch's AdamW whose step
    runs in float32, torch.compile'd per parameter, with the `bf16_stochastic_round` option);
    a ConfigError naming the extra when torchao is not installed."""
    try:
        from torchao.optim import _AdamW
    except ImportError as e:
        raise ConfigError(f"optim.bf16_stochastic_round=true needs torchao's AdamW, which cannot be "
                          f"imported ({e}): {TORCHAO_HINT}") from None
    return _AdamW


def make_optimizer(groups: list[dict], cfg, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the parameter `groups` (each with its own lr) with cfg.optim's settings."""
    o = cfg.optim
    if o.bf16_stochastic_round:  # config allows it with bf16 master weights only
        return stochastic_adamw()(groups, lr=o.lr, weight_decay=o.weight_decay, betas=tuple(o.betas),
                                  bf16_stochastic_round=True)
    # The fused kernel: one call over all of a group's shards. The default on CPU loops over
    # the DTensor parameters op by op, several times slower a step (benchmarks/RESULTS.md §9).
    return torch.optim.AdamW(groups, lr=o.lr, weight_decay=o.weight_decay, betas=tuple(o.betas),
                             fused=device.type in ("cpu", "cuda"))
