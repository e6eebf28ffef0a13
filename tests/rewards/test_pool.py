"""The reward pool: results in order, a hung scorer killed (with what it started), errors and
dead workers counted, the older two-argument reward functions, and the Ray backend on a real
local Ray instance."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from reasonrl_fast.errors import ConfigError
from reasonrl_fast.rewards.pool import RewardPool, RewardPoolError
from tests.helpers.procs import alive

pytestmark = pytest.mark.proc  # real worker processes

FN = "tests.helpers.pool_fns:behave"


def wait_for_file(path, timeout=30.0) -> int:
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.02)
    return int(open(path).read())


def gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not alive(pid)


@pytest.fixture(scope="module")
def pool():
    with RewardPool(FN, num_workers=2, timeout_s=1.0) as p:
        yield p


def test_results_in_order(pool):
    truths = [str(i % 7 / 7) for i in range(200)]
    results, m = pool.score([("x", "jitter", t, None) for t in truths])
    assert [r["score"] for r in results] == [float(t) for t in truths]
    assert [r["acc"] for r in results] == [float(t) > 0.5 for t in truths]
    assert (m["reward/timeouts"], m["reward/errors"]) == (0, 0)
    assert 0 <= m["reward/latency_p50_s"] <= m["reward/latency_p99_s"] < 1.0


def test_hung_worker_is_killed_and_replaced(pool, tmp_path):
    marker = str(tmp_path / "pid")
    samples = [("x", "ok", "1", None)] * 3 + [("x", f"pid:{marker}", "1", None)] + [("x", "ok", "1", None)] * 6
    t = time.monotonic()
    results, m = pool.score(samples)
    took = time.monotonic() - t
    hung = wait_for_file(marker)
    assert gone_within(hung, 2.0), "the hung worker is still running"
    assert [r["score"] for r in results] == [1.0] * 3 + [0.0] + [1.0] * 6
    assert (m["reward/timeouts"], m["reward/errors"]) == (1, 0)
    assert m["reward/latency_p99_s"] >= 1.0 and took < 1.0 + 5.0, took
    # the replacement works, and the next step is back to normal
    results, m = pool.score([("x", "ok", "1", None)] * 8)
    assert [r["score"] for r in results] == [1.0] * 8 and m["reward/timeouts"] == 0


def test_timeout_kills_what_the_scorer_started(pool, tmp_path):
    marker = str(tmp_path / "child")
    results, m = pool.score([("x", f"spawn:{marker}", "1", None)])
    child = wait_for_file(marker)
    assert m["reward/timeouts"] == 1 and results[0]["score"] == 0.0
    assert gone_within(child, 2.0), "the scorer's subprocess outlived the kill"


def test_errors_and_deaths_are_counted(pool):
    kinds = ["ok", "raise", "ok", "die", "ok", "ok", "raise", "ok"]
    results, m = pool.score([("x", k, "1", None) for k in kinds])
    assert [r["score"] for r in results] == [0.0 if k in ("raise", "die") else 1.0 for k in kinds]
    assert (m["reward/errors"], m["reward/timeouts"]) == (3, 0)
    assert "RuntimeError: a broken scorer" in pool.last_error or "died" in pool.last_error


def test_step_time_is_bounded_by_the_timeout():
    # every sample hangs: two workers, four samples -> two rounds of one timeout each
    with RewardPool(FN, num_workers=2, timeout_s=0.5) as p:
        t = time.monotonic()
        results, m = p.score([("x", "hang", "1", None)] * 4)
        took = time.monotonic() - t
    assert m["reward/timeouts"] == 4 and all(r["score"] == 0.0 for r in results)
    assert 1.0 <= took < 1.0 + 6.0, took  # replacements start in ~0.2 s each


def test_two_argument_functions_and_bad_returns():
    with RewardPool("tests.helpers.pool_fns:two_args", num_workers=1) as p:
        results, m = p.score([("math", "42", "42", None), ("math", "41", "42", None)])
    assert results == [{"score": 0.25, "acc": True}, {"score": 0.0, "acc": False}]
    with RewardPool("tests.helpers.pool_fns:returns_junk", num_workers=1) as p:
        results, m = p.score([("x", "dict", "1", None), ("x", "str", "1", None)])
        assert m["reward/errors"] == 2 and "TypeError" in p.last_error
    with RewardPool("tests.helpers.pool_fns:exits", num_workers=1) as p:
        results, m = p.score([("x", "a", "1", None)] * 3)
    assert m["reward/errors"] == 3  # sys.exit() is an error, and the worker keeps serving


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="reward.num_workers"):
        RewardPool(FN, num_workers=0)
    with pytest.raises(ValueError, match="reward.timeout_s"):
        RewardPool(FN, timeout_s=0)
    with pytest.raises(ValueError, match="reward.backend"):
        RewardPool(FN, backend="threads")
    with pytest.raises(ConfigError, match="data.reward_fn"):
        RewardPool("no_such_module_xyz:f")


def test_worker_that_cannot_start_is_an_error(tmp_path):
    # importable in the driver, gone by the time the worker imports it
    f = tmp_path / "vanishing.py"
    f.write_text("def score(a, b):\n    return 1.0\n")
    spec = f"{f}:score"
    p = RewardPool(spec, num_workers=1, start_timeout_s=30)
    f.unlink()
    with pytest.raises(RewardPoolError, match="failed to start: RewardFnError: .*no such file"):
        p.score([("x", "a", "b", None)])


def test_workers_die_with_the_driver(tmp_path):
    """A driver killed with SIGKILL (no cleanup runs) takes its reward workers with it, even one
    stuck in a scorer."""
    marker = tmp_path / "pid"
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from reasonrl_fast.rewards.pool import RewardPool
        p = RewardPool({FN!r}, num_workers=2, timeout_s=600)
        p.score([("x", "pid:{marker}", "1", None)])
    """)
    driver = subprocess.Popen([sys.executable, "-c", code])
    try:
        worker = wait_for_file(str(marker))
        assert alive(worker)
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
        assert gone_within(worker, 3.0), "a reward worker outlived its driver"
    finally:
        driver.kill()


@pytest.mark.e2e  # starts Ray
def test_ray_backend(tmp_path):
    """The same guarantees with the workers as actors on a real local Ray instance."""
    import ray

    from reasonrl_fast.runtime.ray_cluster import start_ray
    from reasonrl_fast.config import load_config

    started = start_ray(load_config(None, ["trainer.workers_per_node=1"]))
    try:
        with RewardPool(FN, num_workers=2, timeout_s=1.0, backend="ray") as p:
            kinds = ["ok", "hang", "ok", "raise", "die", "ok", "ok", "ok"]
            results, m = p.score([("x", k, "1", None) for k in kinds])
            assert [r["score"] for r in results] == [1.0 if k == "ok" else 0.0 for k in kinds]
            assert (m["reward/timeouts"], m["reward/errors"]) == (1, 2)
            results, m = p.score([("x", "jitter", str(i / 10), None) for i in range(10)])
            assert [r["score"] for r in results] == [i / 10 for i in range(10)]
    finally:
        if started:
            from reasonrl_fast.runtime import ray_cluster as cluster

            ray.shutdown()
            cluster._watchdog.stdin.close()  # a clean stop: the reaper leaves without killing


_IMPORTED = """
import json, sys
from reasonrl_fast.rewards.worker import Scorer
s = Scorer({"reward_fn": "", "sandbox_timeout_s": 5.0, "routes": {}, "kinds": json.loads(sys.argv[1])})
right = s.run(("aime24", "so\\nAnswer: 7", "7", None))
print(json.dumps([right[1]["acc"], *(m in sys.modules for m in ("math_verify", "sympy", "reasonrl_fast.rewards.code"))]))
"""


@pytest.mark.parametrize("kinds, imported", [
    (None, [True, True, True]),      # every kind: what a pool not told its samples' kinds does
    (["dapo"], [False, False, False]),
    (["dapo", "math"], [True, True, False]),
    ([], [False, False, False]),     # a kind not named still scores: its first sample imports it
])
def test_a_worker_imports_the_scorers_of_the_kinds_it_is_given(kinds, imported):
    """A reward worker imports, before its first sample, what its pool's samples' scorer kinds use
    (rewards/score.py SCORER_MODULES): math-verify and sympy, about a second a process, only where
    a math-kind sample can come."""
    import json

    p = subprocess.run([sys.executable, "-c", _IMPORTED, json.dumps(kinds)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.splitlines()[-1]) == [True, *imported]


def test_scorer_kinds_of_a_runs_sources():
    from reasonrl_fast.rewards.score import SCORER_MODULES, SCORERS, scorer_kinds

    assert scorer_kinds(["aime24", "math_dapo", "humaneval", "HuggingFaceH4/MATH-500", "math_dapo_boxed"]) == {
        "dapo", "code", "math", "boxed"}
    assert set(SCORER_MODULES) == set(SCORERS)  # each kind says what it imports
