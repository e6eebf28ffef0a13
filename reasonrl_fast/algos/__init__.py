"""The RL algorithms, by name (`algo`; algos/base.py says what one gives). A new algorithm is one
module defining an `Algo` subclass and one line here; config's `algo` choices are these keys.

The entries are "module:Class" paths, imported when an algorithm is first asked for (as verl's
rollout registry does): reading the settings imports no algorithm, and an algorithm's facts
answer without torch (algos/base.py)."""

from __future__ import annotations

import functools
import pkgutil

from reasonrl_fast.algos.base import Algo, advantages, overlong_penalty

ALGOS: dict[str, str] = {
    "flowrl": "reasonrl_fast.algos.flowrl:FlowRL",
    "grpo": "reasonrl_fast.algos.grpo:GRPO",
    "fapo": "reasonrl_fast.algos.fapo:FAPO",
}


def get_algo(name: str) -> Algo:
    """The algorithm called `name` (one instance per class path); a ValueError listing the known
    ones otherwise."""
    try:
        path = ALGOS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}: known algorithms are {', '.join(ALGOS)}") from None
    return _instance(path)


@functools.cache
def _instance(path: str):
    return pkgutil.resolve_name(path)()


__all__ = ["ALGOS", "Algo", "advantages", "get_algo", "overlong_penalty"]
