"""ZHead: FlowRL's learned log-partition function log Z(x) (docs/math.md §Z-head)."""

from __future__ import annotations

import torch
from torch import nn

from reasonrl_fast.ops.masked_mean import masked_mean


class ZHead(nn.Module):
    """log Z = MLP(mean of the last-layer hidden states over the prompt tokens).

    ``net`` is ``(num_layers - 1) x [Linear(H, H), GELU, LayerNorm(H), Dropout] + Linear(H, 1)``,
    so state_dict keys are ``net.0.weight``, ``net.0.bias``, ``net.2.weight``, ... and verl's
    FlowRL ``proj_z.*`` tensors load as they are. The pooled states are not
    detached: the TB loss trains the backbone through log Z too.
    """

    def __init__(self, hidden_size: int, num_layers: int = 3, dropout: float = 0.1):
        super().__init__()
        if hidden_size < 1 or num_layers < 1:
            raise ValueError(f"ZHead: hidden_size and num_layers must be >= 1, got {hidden_size}, {num_layers}")
        layers: list[nn.Module] = []
        for _ in range(num_layers - 1):
            layers += [nn.Linear(hidden_size, hidden_size), nn.GELU(), nn.LayerNorm(hidden_size), nn.Dropout(dropout)]
        layers.append(nn.Linear(hidden_size, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, hidden_states: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """hidden_states [B, T, H], prompt_mask [B, T] -> log Z [B] (in the head's dtype)."""
        pooled = masked_mean(hidden_states, prompt_mask)
        return self.net(pooled.to(self.net[0].weight.dtype)).squeeze(-1)
