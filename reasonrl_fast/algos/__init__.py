"""The RL algorithms, by name (`algo`; algos/base.py says what one gives). A new algorithm is one
module defining an `Algo` subclass and one line in the table; config's `algo` choices are its keys.

The table itself (registry.py `ALGOS`, re-exported here) is plain data on the ground floor: its
entries are "module:Class" paths, imported when an algorithm is first asked for (as verl's
rollout registry does), so reading the settings imports no algorithm package, and an
algorithm's facts answer without torch (algos/base.py). An algorithm with settings of its own
declares them (`section`, `Settings`: algos/flowrl.py)."""

from __future__ import annotations

from reasonrl_fast.algos.base import Algo, advantages, groups_with_spread, overlong_penalty
from reasonrl_fast.registry import ALGOS


def get_algo(name: str) -> Algo:
    """The algorithm called `name` (one instance per class path); a ValueError listing the known
    ones otherwise."""
    return ALGOS.lookup(name)


__all__ = ["ALGOS", "Algo", "advantages", "get_algo", "groups_with_spread", "overlong_penalty"]
