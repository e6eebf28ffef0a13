"""Which scorer a sample goes to, and the one shape every scorer's answer is brought into.

Routing follows verl's `data_source` names, so a dataset prepared for it scores
the same here: `math_dapo` and `aime*` use its DAPO scorer (±1, its own answer extraction),
`math_dapo_boxed` (and `math-dapo`, the name the published FAPO data carries) the FAPO runs'
box-only verifier (±1 on the last \\boxed{}), code sources run the program in the sandbox
(code.py), `genrm*` sources score a GenRM's verdict on a solution's steps (genrm.py), `partition`
sources a sum of digits (partition.py, the embedded task with many right answers), and everything
else is a math answer checked for mathematical equality (math.py, 1/0). One dataset can mix them.
A user's `data.reward_fn` replaces the routing for every sample.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
from typing import Any, Callable

from reasonrl_fast.errors import ConfigError

# Sources whose ground truth is a JSON test specification (docs/math.md §Data records): stdin/stdout
# cases or a HumanEval-style test. Compared in lower case; a source that starts with one of these
# counts too ("livecodebench_v5", "humaneval_plus").
CODE_SOURCES = ("code", "humaneval", "mbpp", "livecodebench", "codecontests", "apps", "taco",
                "codeforces", "leetcode", "primeintellect", "prime_code")
DAPO_SOURCES = ("math_dapo", "math_dapo_reasoning")
# DAPO-Math-17k with a \boxed{} instruction in place of "Answer:" (data/prepare.py --boxed
# writes the first), scored as the published FAPO and baseline runs score it; `math-dapo` is the
# data_source of verl recipe/fapo's fapo-train-boxed.parquet, which no verl default routes.
BOXED_SOURCES = ("math_dapo_boxed", "math-dapo")
# Scorers that compare one final answer with the ground truth, so that samples can vote on it
# (maj@n); the others judge programs, partitions or verdicts.
ANSWER_SCORERS = ("math", "dapo", "boxed")
GENRM_PREFIX = "genrm"  # GenRM training records (docs/math.md §Data records): "genrm", "genrm_addition"
PARTITION_SOURCES = ("partition",)


def scorer_for(data_source: str) -> str:
    """'code', 'dapo', 'boxed', 'genrm', 'partition' or 'math': the scorer `default_compute_score`
    uses for this source."""
    src = (data_source or "").lower()
    if src.startswith(CODE_SOURCES):
        return "code"
    if src in PARTITION_SOURCES:
        return "partition"
    if src.startswith(GENRM_PREFIX):
        return "genrm"
    if src in BOXED_SOURCES:
        return "boxed"
    if src in DAPO_SOURCES or src.startswith("aime"):
        return "dapo"
    return "math"


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any,
                          extra_info: dict | None = None, *, sandbox_timeout_s: float = 10.0) -> dict:
    """{"score", "acc"} of one response, by the scorer its `data_source` selects."""
    kind = scorer_for(data_source)
    if kind == "code":
        from reasonrl_fast.rewards.code import code_score

        return code_score(solution_str, ground_truth, extra_info, timeout_s=sandbox_timeout_s)
    if kind == "genrm":
        from reasonrl_fast.rewards.genrm import genrm_score

        return genrm_score(solution_str, ground_truth, extra_info)
    if kind == "partition":
        from reasonrl_fast.rewards.partition import partition_score

        return partition_score(solution_str, ground_truth, extra_info)
    from reasonrl_fast.rewards import math as math_rewards

    if kind == "dapo":
        out = math_rewards.dapo_score(solution_str, str(ground_truth))
        return {"score": out["score"], "acc": out["acc"]}
    if kind == "boxed":  # ±1 as the published baseline's reward; FAPO forms its own from `acc`
        out = math_rewards.boxed_score(solution_str, ground_truth)
        return {"score": out["score"], "acc": out["acc"]}
    return math_rewards.compute_score(solution_str, ground_truth, extra_info)


class RewardFnError(ConfigError):
    """`data.reward_fn` names no function that can be loaded; the message says why."""


def load_reward_fn(spec: str) -> Callable:
    """'' -> default_compute_score; 'package.module:function' or 'path/to/file.py:function' ->
    that function. Each way it can fail is a RewardFnError naming `data.reward_fn`."""
    if not spec:
        return default_compute_score
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise RewardFnError(f"data.reward_fn={spec!r}: expected `module:function` or "
                            f"`path/to/file.py:function`")
    try:
        if where.endswith(".py"):
            if not os.path.isfile(where):
                raise RewardFnError(f"data.reward_fn={spec!r}: no such file {where!r}")
            loader = importlib.util.spec_from_file_location(os.path.basename(where)[:-3], where)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except RewardFnError:
        raise
    except ModuleNotFoundError as e:
        raise RewardFnError(f"data.reward_fn={spec!r}: cannot import {where!r} ({e})") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while it was imported
        raise RewardFnError(f"data.reward_fn={spec!r}: importing {where!r} failed "
                            f"({type(e).__name__}: {e})") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RewardFnError(f"data.reward_fn={spec!r}: {where!r} has no function {name!r}")
    return fn


def takes_two_args(fn: Callable) -> bool:
    """True for the older `fn(response, answer)` reward functions: exactly two positional
    parameters and no `solution_str`. Everything else gets verl's signature
    `fn(data_source, solution_str, ground_truth, extra_info)`."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: assume the reference one
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = {p.name for p in params}
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    return len(positional) == 2 and not varargs and "solution_str" not in names


def as_result(value: Any) -> dict:
    """A scorer's float or {"score", "acc", ...} dict as {"score": float, "acc": bool}. A bare
    float counts as right when it is positive. A non-finite score is passed on as it is: the
    trainer counts it (`reward/nonfinite`) and uses 0."""
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"a reward function returned a dict without 'score': {sorted(value)}")
        score = float(value["score"])
        acc = bool(value["acc"]) if "acc" in value else (math.isfinite(score) and score > 0)
        return {"score": score, "acc": acc}
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"a reward function must return a float or a dict with 'score', "
                        f"got {type(value).__name__}") from None
    return {"score": score, "acc": math.isfinite(score) and score > 0}


def call_reward_fn(fn: Callable, two_args: bool, data_source: str, solution_str: str,
                   ground_truth: Any, extra_info: dict | None) -> dict:
    if two_args:
        return as_result(fn(solution_str, ground_truth))
    return as_result(fn(data_source, solution_str, ground_truth, extra_info))
