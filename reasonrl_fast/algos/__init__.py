"""The RL algorithms, by name (`algo`; algos/base.py says what one gives). A new algorithm is one
module defining an `Algo` subclass and one line here; config's `algo` choices are these keys."""

from __future__ import annotations

from reasonrl_fast.algos.base import Algo, advantages, overlong_penalty
from reasonrl_fast.algos.fapo import FAPO
from reasonrl_fast.algos.flowrl import FlowRL
from reasonrl_fast.algos.grpo import GRPO

ALGOS: dict[str, Algo] = {
    "flowrl": FlowRL(),
    "grpo": GRPO(),
    "fapo": FAPO(),
}


def get_algo(name: str) -> Algo:
    """The algorithm called `name`; a ValueError listing the known ones otherwise."""
    try:
        return ALGOS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}: known algorithms are {', '.join(ALGOS)}") from None


__all__ = ["ALGOS", "Algo", "advantages", "get_algo", "overlong_penalty"]
