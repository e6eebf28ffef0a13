"""Input checks on the Python side of the ops.

The C++/CUDA kernels validate their inputs themselves (csrc/checks.h); their fake
implementations (register_fake) repeat those checks with torch._check_* so that torch.compile
rejects the same inputs while it traces (dynamo reports it as a TorchRuntimeError whose message
quotes the ValueError or TypeError). linear_token_logprob is a Python op: the checks at the end
of this file are its only ones, shared by its real and fake implementations.
"""

from __future__ import annotations

import torch


def tracing(t: torch.Tensor) -> bool:
    """Whether an op runs under torch.compile, or on fake / functional tensors (export,
    opcheck, AOT tracing), where N must not become data-dependent or be specialised."""
    return (torch.compiler.is_compiling() or type(t) is not torch.Tensor
            or torch._guards.detect_fake_mode(t) is not None)


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


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation (and output) dtype: float64 for float64 inputs, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------- linear_token_logprob

def _need(err, cond, msg):
    # torch._check_with takes plain and symbolic (fake tensor) conditions alike, so the real
    # and the fake implementations share these checks.
    torch._check_with(err, cond, lambda: msg)


def _on(name, what, t, dev):
    _need(ValueError, t.device == dev, f"{name}: {what} is on {t.device}, hidden on {dev}")


def _vec(name, what, t, N, dev, allow_empty=False):
    """t must be a floating [N] tensor on dev ([0] too when allow_empty)."""
    _need(TypeError, t.is_floating_point(), f"{name}: {what} must be floating point, got {t.dtype}")
    shape_ok = t.dim() == 1 and t.shape[0] == N
    if allow_empty and t.dim() == 1:
        shape_ok = shape_ok | (t.shape[0] == 0)
    _need(ValueError, shape_ok, f"{name}: {what} must be [N] = [{N}], got {tuple(t.shape)}")
    _on(name, what, t, dev)


def check_linear_inputs(name, hidden, weight, target, bias, temperature):
    """Shapes, dtypes, devices and temperature of the arguments both ops share."""
    _need(TypeError, hidden.dtype in KERNEL_FLOATS,
          f"{name}: hidden must be float32, bfloat16, float16 or float64, got {hidden.dtype}")
    _need(TypeError, weight.dtype == hidden.dtype,
          f"{name}: weight ({weight.dtype}) must have hidden's dtype ({hidden.dtype})")
    _need(ValueError, hidden.dim() == 2,
          f"{name}: hidden must be [N, H], got {tuple(hidden.shape)}")
    N, H = hidden.shape
    _need(ValueError, weight.dim() == 2 and weight.shape[1] == H,
          f"{name}: weight must be [V, H] with H = {H}, got {tuple(weight.shape)}")
    V = weight.shape[0]
    _need(ValueError, (V > 0) | (N == 0), f"{name}: the vocabulary (weight.shape[0]) is empty")
    dev = hidden.device
    _on(name, "weight", weight, dev)
    if bias is not None:
        _need(TypeError, bias.dtype == hidden.dtype,
              f"{name}: bias ({bias.dtype}) must have hidden's dtype ({hidden.dtype})")
        _need(ValueError, bias.dim() == 1 and bias.shape[0] == V,
              f"{name}: bias must be [V] = [{V}], got {tuple(bias.shape)}")
        _on(name, "bias", bias, dev)
    _need(TypeError, not (target.is_floating_point() or target.is_complex()
                          or target.dtype == torch.bool),
          f"{name}: target must hold integer ids, got {target.dtype}")
    _need(ValueError, target.dim() == 1 and target.shape[0] == N,
          f"{name}: target must be [N] = [{N}], got {tuple(target.shape)}")
    _on(name, "target", target, dev)
    t = float(temperature)
    _need(ValueError, 0 < t < float("inf"), f"{name}: temperature must be > 0, got {temperature}")
    # The kernels scale by 1/temperature in the accumulation dtype: an infinite scale would
    # turn every logit into +-inf or NaN. Down to the smallest normal number 1/temperature is
    # finite (about max/4), the bound token_logprob's kernels use too.
    tiny = torch.finfo(acc_dtype(hidden.dtype)).tiny
    _need(ValueError, t >= tiny,
          f"{name}: temperature {temperature} is too small for {hidden.dtype} inputs: "
          f"1/temperature overflows; the smallest supported temperature is {tiny:.6g}")


def linear_targets(target: torch.Tensor, V: int, ignore_index: int) -> torch.Tensor:
    """target as contiguous int64 after checking every id is in [0, V) or ignore_index."""
    # uint64 ids from 2**63 on become negative in int64 (possibly ignore_index): they are
    # out of range whatever ignore_index is.
    wide = target.dtype == torch.uint64
    t = (target.view(torch.int64) if wide else target.to(torch.long)).contiguous()
    ok = (t == ignore_index) | ((t >= 0) & (t < V))
    if wide:
        ok = ok & (t >= 0)
    if t.device.type == "cuda" or type(t) is not torch.Tensor:
        # CUDA, or traced (fake / functional tensors under torch.compile or export): a graph
        # op instead of a data-dependent Python branch.
        # No host sync: a bad id fails a device-side assertion, which surfaces as a Python
        # RuntimeError at the caller's next synchronisation (e.g. .item(), .cpu(), backward).
        torch._assert_async(ok.all(), "linear_token_logprob: target id outside [0, V)")
        return t
    if t.numel() and not bool(ok.all()):
        n = int((~ok).nonzero()[0, 0])
        raise IndexError(
            f"linear_token_logprob: target id {target[n].item()} at flat position {n} is "
            f"outside the vocabulary [0, {V}) and is not ignore_index ({ignore_index})"
        )
    return t


def check_linear_backward_inputs(grad_logprob, grad_entropy, hidden, weight, target, bias, lse,
                                 entropy, temperature):
    name = "linear_token_logprob_backward"
    check_linear_inputs(name, hidden, weight, target, bias, temperature)
    N, dev = hidden.shape[0], hidden.device
    _vec(name, "grad_logprob", grad_logprob, N, dev)
    _vec(name, "lse", lse, N, dev)
    # entropy is [0] when the forward did not compute it; an entropy gradient needs it.
    _vec(name, "entropy", entropy, N, dev, allow_empty=grad_entropy is None)
    if grad_entropy is not None:
        _vec(name, "grad_entropy", grad_entropy, N, dev)
