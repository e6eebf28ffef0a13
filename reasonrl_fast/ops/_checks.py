"""Input checks shared by the fake implementations (register_fake) of the ops.

The kernels validate their inputs themselves (csrc/checks.h); the fake implementations repeat
those checks with torch._check_* so that torch.compile rejects the same inputs while it traces
(dynamo reports it as a TorchRuntimeError whose message quotes the ValueError or TypeError).
"""

from __future__ import annotations

import torch


def value(cond, msg: str) -> None:
    """ValueError(msg) unless cond (messages are cheap to build: this runs once per trace)."""
    torch._check_value(cond, lambda: msg)


def dtype(cond, msg: str) -> None:
    """TypeError(msg) unless cond."""
    torch._check_type(cond, lambda: msg)


def check_devices(op: str, first: torch.Tensor, *rest: torch.Tensor) -> None:
    for t in rest:
        value(t.device == first.device,
              f"{op}: all inputs must be on one device, got {t.device} and {first.device}")


def check_mask_dtype(op: str, mask: torch.Tensor) -> None:
    dtype(not mask.dtype.is_complex,
          f"{op}: the mask must be bool, integer or floating point, got {mask.dtype}")


# The floating dtypes the kernels are instantiated for.
KERNEL_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def check_kernel_float(op: str, name: str, t: torch.Tensor) -> None:
    dtype(t.dtype in KERNEL_FLOATS,
          f"{op}: {name} must be floating point (float64, float32, float16 or bfloat16), got {t.dtype}")
