"""Shared pieces of the op tests: the devices each test runs on, tolerances, error measures
against float64 references, opcheck/gradcheck and recompile checks.

Every op test file takes a `device` parameter over DEVICES (pytorch/extension-cpp style): CPU
always, CUDA where a GPU is present. The C++ ops also need the extension built with its CUDA
kernels; where it was built CPU-only their CUDA cases skip with a reason.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable, Sequence

import pytest
import torch

import reasonrl_fast.ops  # noqa: F401  (registers torch.ops.reasonrl_fast.*)

OPS = torch.ops.reasonrl_fast
HAS_CUDA = torch.cuda.is_available()


@functools.lru_cache(maxsize=None)
def cuda_kernels_built() -> bool:
    """True when the C++ ops have CUDA kernels (the extension can be built CPU-only)."""
    if not HAS_CUDA:
        return False
    try:
        OPS.masked_mean(torch.zeros(1, 1, 8, device="cuda"), torch.ones(1, 1, device="cuda"))
        return True
    except (NotImplementedError, RuntimeError):
        return False


_NO_KERNELS = "reasonrl_fast was built without CUDA kernels"

# The C++ ops (csrc/): CUDA only where the extension has its CUDA kernels.
DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.skipif(
    not cuda_kernels_built(), reason=_NO_KERNELS))] if HAS_CUDA else [])
# Ops written in Python (Triton on CUDA): a GPU is enough.
PY_DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
# Tests with no CPU twin (device-side assertions, streams): CUDA, or one clean skip.
cuda_only = pytest.mark.skipif(not cuda_kernels_built(),
                               reason="needs a GPU and reasonrl_fast built with CUDA kernels")

# assert_close tolerances against a float64 reference, by the dtype the op computed in.
TOL = {
    torch.float64: dict(rtol=1e-10, atol=1e-10),
    torch.float32: dict(rtol=2e-5, atol=2e-5),
}
LOW_PRECISION = (torch.bfloat16, torch.float16)
ALL_FLOATS = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| in float64 on the CPU; equal entries (the same infinity) count 0, a NaN
    in `a` where `b` has none gives NaN. 0 for empty tensors."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if a.numel() == 0:
        return 0.0
    return torch.where(a == b, 0.0, (a - b).abs()).max().item()


def assert_within_twice(ours: torch.Tensor, plain: torch.Tensor, exact: torch.Tensor,
                        floor: float = 1e-6, what: str = "") -> None:
    """The standard for low precision: our error against the float64 truth is at most twice
    plain PyTorch's at the same precision (plus a tiny floor for errors of exactly 0)."""
    e_o, e_p = max_err(ours, exact), max_err(plain, exact)
    assert e_o <= 2 * e_p + floor, f"{what}: error {e_o:.3g} > 2 x plain PyTorch's {e_p:.3g}"


def opcheck(op, args: Sequence, **kwargs) -> None:
    """torch.library.opcheck, with the op's name in the failure."""
    try:
        torch.library.opcheck(op, tuple(args), **kwargs)
    except Exception as e:  # noqa: BLE001 - re-raised with the op named
        raise AssertionError(f"opcheck of {op} failed: {e}") from e


def gradcheck(fn: Callable, inputs: Sequence[torch.Tensor], **kwargs) -> None:
    """torch.autograd.gradcheck in float64 (the inputs must be float64 leaves)."""
    assert all(t.dtype == torch.float64 for t in inputs if isinstance(t, torch.Tensor))
    assert torch.autograd.gradcheck(fn, tuple(inputs), **kwargs)


def check_typed_outcomes(lines: list[str], expected: int) -> None:
    """Each line of a child's output is "<expected exception type>|<outcome>"."""
    assert len(lines) == expected, lines
    for line in lines:
        want, got = line.split("|", 1)
        assert got.split(":")[0] == want, line


def assert_no_recompile(fn: Callable, make_args: Callable[[int], Sequence],
                        sizes: Iterable[int] = (3, 5, 9), backend: str = "aot_eager",
                        dynamic: bool = True) -> None:
    """torch.compile(fn, fullgraph=True, dynamic=dynamic) called at each batch size compiles one
    graph and never recompiles (dynamo is told to raise on a recompile); each call matches
    eager. Sizes 0 and 1 are avoided: dynamo specialises them by design."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic, backend=backend)
    # No inductor/AOT caches: a cache written by an older implementation could be replayed.
    with torch._dynamo.config.patch(error_on_recompile=True), \
            torch._inductor.config.patch(force_disable_caches=True):
        for n in sizes:
            args = make_args(n)
            torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
