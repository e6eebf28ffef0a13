"""Input checks shared by the fake implementations (register_fake) of the ops.

The kernels validate their inputs themselves (csrc/checks.h); the fake implementations repeat
those checks with torch._check_* so that torch.compile rejects the same inputs while it traces
(dynamo reports it as a TorchRuntimeError whose message quotes the ValueError or TypeError).
"""

from __future__ import annotations

import torch


def check_devices(op: str, first: torch.Tensor, *rest: torch.Tensor) -> None:
    for t in rest:
        torch._check_value(t.device == first.device,
                           lambda: f"{op}: all inputs must be on one device, got {t.device} and {first.device}")


def check_mask_dtype(op: str, mask: torch.Tensor) -> None:
    torch._check_type(not mask.dtype.is_complex,
                      lambda: f"{op}: the mask must be bool, integer or floating point, got {mask.dtype}")


# The floating dtypes the kernels are instantiated for.
KERNEL_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def check_kernel_float(op: str, name: str, t: torch.Tensor) -> None:
    torch._check_type(t.dtype in KERNEL_FLOATS, lambda: (
        f"{op}: {name} must be floating point (float64, float32, float16 or bfloat16), got {t.dtype}"))
