"""Fused ops as torch.library custom ops (namespace `reasonrl_fast`, see csrc/ops.cpp).

    from reasonrl_fast.ops import token_logprob, linear_token_logprob, group_advantage, tb_loss, ZHead, masked_mean

The CPU kernels' loops are built per CPU capability (csrc/capability.h: default, avx2, avx512)
and run at the widest this CPU has, or the one REASONRL_CPU_CAPABILITY (else ATen's
ATEN_CPU_CAPABILITY) names: `cpu_capability()` says which, `cpu_capabilities()` which this CPU
has, and `set_cpu_capability(name)` (or the context manager `capability(name)`) forces one for
the process, as the tests and benchmarks do.
"""

import contextlib

import torch  # noqa: F401  (loads libc10/libtorch, which _C links against, before _C)

from reasonrl_fast import _C  # registers torch.ops.reasonrl_fast.*
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.ops.group_advantage import group_advantage
from reasonrl_fast.ops.linear_token_logprob import linear_token_logprob
from reasonrl_fast.ops.masked_mean import masked_mean
from reasonrl_fast.ops.tb_loss import tb_loss
from reasonrl_fast.ops.token_logprob import token_logprob
from reasonrl_fast.ops.zhead import ZHead



def cpu_capability() -> str:
    """The CPU capability the CPU kernels run at: default, avx2 or avx512."""
    return _C.cpu_capability()


def cpu_capabilities() -> list[str]:
    """The capabilities this CPU has, narrowest first (default always)."""
    return _C.cpu_capabilities()


def set_cpu_capability(name: str) -> str:
    """Run the CPU kernels at `name` from now on in this process; returns the one before.
    ConfigError where the name is unknown or this CPU lacks it."""
    try:
        return _C.set_cpu_capability(name)
    except ValueError as e:
        raise ConfigError(str(e)) from None


@contextlib.contextmanager
def capability(name: str):
    """The CPU kernels at `name` inside the block, as before after it."""
    before = set_cpu_capability(name)
    try:
        yield name
    finally:
        set_cpu_capability(before)


try:  # a bad REASONRL_CPU_CAPABILITY is named at import, not at the first op
    cpu_capability()
except ValueError as e:
    raise ConfigError(str(e)) from None

__all__ = [
    "cpu_capability",
    "cpu_capabilities",
    "set_cpu_capability",
    "capability",
    "token_logprob",
    "linear_token_logprob",
    "group_advantage",
    "tb_loss",
    "ZHead",
    "masked_mean",
]
