"""Which scorer a sample goes to, and the one shape every scorer's answer is brought into.

Routing follows verl's `data_source` names, so a dataset prepared for it scores
the same here: `math_dapo` and `aime*` use its DAPO scorer (±1, its own answer extraction),
`math_dapo_boxed` (and `math-dapo`, the name the published FAPO data carries) the FAPO runs'
box-only verifier (±1 on the last \\boxed{}), as is `gpqa-diamond` (the right choice's letter in
a box), code sources run the program in the sandbox
(code.py), `genrm*` sources score a GenRM's verdict on a solution's steps (genrm.py), and
everything else is a math answer checked for mathematical equality (math.py, 1/0). One dataset
can mix them. The embedded tasks' records go to the scorer each task names (tasks/base.py
`Task.scorer`), which the tasks registry tells this module (`add_routes`). A user's
`data.reward_fn` replaces the routing for every sample.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import math
import os
import pkgutil
from typing import Any, Callable, Iterable

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
# GPQA-Diamond as the published FAPO validation set writes it (data/prepare.py gpqa-diamond): the
# right choice's letter in a box, scored by the same box verifier.
LETTER_SOURCES = ("gpqa-diamond",)
# Scorers that compare one final answer with the ground truth, so that samples can vote on it
# (maj@n); the others judge programs, partitions or verdicts.
ANSWER_SCORERS = ("math", "dapo", "boxed")
# The data_source that routes to each answer scorer: what a validation set's `scorer`
# (data.val_sets) scores its records as, whatever their own data_source.
SCORER_SOURCES = {"math": "math", "dapo": DAPO_SOURCES[0], "boxed": BOXED_SOURCES[0]}
GENRM_PREFIX = "genrm"  # GenRM training records (docs/math.md §Data records): "genrm", "genrm_<task>"


# ---------------------------------------------------------------- the scorers, by kind
# Each is called as fn(solution_str, ground_truth, extra_info, sandbox_timeout_s) and imports its
# module when first called: a reward worker imports only what it scores.


def _math(solution_str: str, ground_truth: Any, extra_info: dict | None, sandbox_timeout_s: float) -> dict:
    from reasonrl_fast.rewards.math import compute_score

    return compute_score(solution_str, ground_truth, extra_info)


def _dapo(solution_str: str, ground_truth: Any, extra_info: dict | None, sandbox_timeout_s: float) -> dict:
    from reasonrl_fast.rewards.math import dapo_score

    return dapo_score(solution_str, str(ground_truth))


def _boxed(solution_str: str, ground_truth: Any, extra_info: dict | None, sandbox_timeout_s: float) -> dict:
    from reasonrl_fast.rewards.math import boxed_score  # ±1 as the published baseline's; FAPO forms its own from `acc`

    return boxed_score(solution_str, ground_truth)


def _code(solution_str: str, ground_truth: Any, extra_info: dict | None, sandbox_timeout_s: float) -> dict:
    from reasonrl_fast.rewards.code import code_score

    return code_score(solution_str, ground_truth, extra_info, timeout_s=sandbox_timeout_s)


def _genrm(solution_str: str, ground_truth: Any, extra_info: dict | None, sandbox_timeout_s: float) -> dict:
    from reasonrl_fast.rewards.genrm import genrm_score

    return genrm_score(solution_str, ground_truth, extra_info)


SCORERS: dict[str, Callable[..., dict]] = {"math": _math, "dapo": _dapo, "boxed": _boxed, "code": _code,
                                           "genrm": _genrm}
"""The scorer kinds. A kind that is not a key here is an embedded task's own scorer,
"module:function" called as fn(solution_str, ground_truth, extra_info)."""
SCORER_MODULES: dict[str, tuple[str, ...]] = {
    "math": ("reasonrl_fast.rewards.math", "math_verify"), "dapo": ("reasonrl_fast.rewards.math",),
    "boxed": ("reasonrl_fast.rewards.math",), "code": ("reasonrl_fast.rewards.code",),
    "genrm": ("reasonrl_fast.rewards.genrm",)}
"""What each scorer kind imports by its first sample (math-verify, behind the math kind's
comparison, pulls in sympy: about a second, benchmarks/RESULTS.md §4): a reward worker imports
them before its first sample's time limit starts, for the kinds its run scores only."""


def import_scorers(kinds: Iterable[str]) -> None:
    """Import what the scorers of `kinds` import by their first sample (an embedded task's own
    scorer: resolved), so that no sample's time limit pays for it."""
    for kind in kinds:
        for module in SCORER_MODULES.get(kind, ()):
            importlib.import_module(module)
        if kind not in SCORERS:
            scorer(kind)


def scorer_kinds(sources: Iterable[str]) -> set[str]:
    """The scorer kinds that score records of these data_sources (`scorer_for`)."""
    return {scorer_for(source) for source in sources}


def scorer(kind: str) -> Callable[..., dict]:
    """The scorer of `kind`, called as fn(solution_str, ground_truth, extra_info, sandbox_timeout_s)."""
    return SCORERS.get(kind) or _own_scorer(kind)


@functools.cache
def _own_scorer(path: str) -> Callable[..., dict]:
    fn = pkgutil.resolve_name(path)
    return lambda solution_str, ground_truth, extra_info, sandbox_timeout_s: fn(solution_str, ground_truth, extra_info)


# ---------------------------------------------------------------- routing by data_source
# The embedded tasks sit a layer above this module, and this module never imports them: the tasks
# registry tells it each task's data_source and scorer (`add_routes`, tasks/__init__.py) instead,
# as a function asked each time, so no task is resolved before a record is routed and a task
# added to the registry later is routed too. The reward pool hands `routes()` to its worker
# processes, which are told them as a dict.
_ROUTES: list[dict[str, str] | Callable[[], dict[str, str]]] = []


def add_routes(routes: dict[str, str] | Callable[[], dict[str, str]]) -> None:
    """Route records of these data_sources (compared in lower case) to these scorer kinds, ahead of
    the public sources: a dict, or a function returning one that is asked at each routing."""
    _ROUTES.append(routes)


def routes() -> dict[str, str]:
    """Every data_source -> scorer kind added with `add_routes` (lower-case sources)."""
    out: dict[str, str] = {}
    for r in _ROUTES:
        out.update((source.lower(), kind) for source, kind in (r() if callable(r) else r).items())
    return out


def scorer_for(data_source: str) -> str:
    """The scorer kind `default_compute_score` uses for this source: an embedded task's own
    (`add_routes`), else 'code', 'genrm', 'boxed', 'dapo' or 'math' by verl's public names."""
    src = (data_source or "").lower()
    own = routes().get(src)
    if own is not None:
        return own
    if src.startswith(CODE_SOURCES):
        return "code"
    if src.startswith(GENRM_PREFIX):
        return "genrm"
    if src in BOXED_SOURCES or src in LETTER_SOURCES:
        return "boxed"
    if src in DAPO_SOURCES or src.startswith("aime"):
        return "dapo"
    return "math"


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any,
                          extra_info: dict | None = None, *, sandbox_timeout_s: float = 10.0) -> dict:
    """{"score", "acc"} of one response, by the scorer its `data_source` selects."""
    out = scorer(scorer_for(data_source))(solution_str, ground_truth, extra_info, sandbox_timeout_s)
    return {"score": out["score"], "acc": out["acc"]}


# ---------------------------------------------------------------- the sandbox's time limit

def check_sandbox(cfg, data_sources) -> None:
    """When one of `data_sources` is scored in the code sandbox (the default routing, a code
    source): a ConfigError when reward.sandbox_timeout_s is not below reward.timeout_s, and the
    UserError of a sandbox this machine cannot build (no libseccomp for its filter), now rather
    than as a reward error on every sample."""
    r = cfg.reward
    code = None if cfg.data.reward_fn else next((s for s in set(data_sources) if scorer_for(s) == "code"), None)
    if code is None:
        return
    if r.sandbox_timeout_s >= r.timeout_s:
        raise ConfigError(f"reward.sandbox_timeout_s={r.sandbox_timeout_s} must be below "
                          f"reward.timeout_s={r.timeout_s}: {code!r} records run in the code sandbox, "
                          f"which must report a slow program before the pool's limit kills its worker "
                          f"(leave reward.sandbox_timeout_s unset for a third of reward.timeout_s)")
    from reasonrl_fast.rewards.seccomp_filter import filter_bpf

    filter_bpf()


# ---------------------------------------------------------------- a user's reward function


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
