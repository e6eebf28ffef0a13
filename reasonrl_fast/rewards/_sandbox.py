"""The launcher that runs inside the sandbox (see code.py for the layers and who sets them up).

Started as a script (`python3 -I -S _sandbox.py`), standard library only. It reads one job
(a marshal-encoded dict: json would cost 13 ms of imports here) on stdin, runs each case of the
program with its limits, and writes one marshal-encoded result on stdout. In the namespaced modes it is pid 1 of a fresh PID namespace: it mounts the private
tmpfs dirs, writes the program into its own tmpfs, and after each case kills every other
process of the namespace (kill(-1)), so a program that setsid()s or daemonises cannot outlive
its case. In the plain mode it is a child subreaper and kills what it adopts.
"""

import ctypes
import marshal
import os
import resource
import select
import signal
import subprocess
import sys
import time

_LIBC = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV, _MS_RDONLY = 2, 4, 1
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
_STDERR_KEEP = 16384  # bytes of a case's stderr kept (the tail)

# Run by the interpreter for assert-style tests: the program, then the tests, in one namespace.
# Passing needs the nonce on the status pipe (its fd in argv[1]), written only after both ran, so a program that exits early
# (sys.exit(0), os._exit(0)) before the tests run does not pass.
_HARNESS = r"""
def _harness():
    import os, sys
    nonce = sys.stdin.readline().strip()
    sys.stdin = open(os.devnull)
    os.dup2(sys.stdin.fileno(), 0)
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    for name in ("solution.py", "tests.py"):
        with open(name) as f:
            src = f.read()
        exec(compile(src, name, "exec"), g)
    os.write(int(sys.argv[1]), nonce.encode())
_harness()
"""


def _mount_tmpfs(target: str, opts: str, flags: int = _MS_NOSUID | _MS_NODEV) -> None:
    if _LIBC.mount(b"tmpfs", target.encode(), b"tmpfs", flags, opts.encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount tmpfs on {target}: {os.strerror(e)}")


def _setup_mounts(job: dict) -> str:
    """Private writable tmpfs on /tmp, /var/tmp, /dev/shm; empty read-only tmpfs over the
    directories to hide. Returns the working directory (inside the private /tmp)."""
    size = job["tmpfs_mb"]
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(d):
            _mount_tmpfs(d, f"size={size}m,nr_inodes=4096,mode=1777")
    for d in job["hide"]:
        if os.path.isdir(d) and not os.path.islink(d):
            _mount_tmpfs(d, "size=1m,nr_inodes=16,mode=755", _MS_NOSUID | _MS_NODEV | _MS_RDONLY)
    work = "/tmp/work"
    os.mkdir(work, 0o700)
    return work


def _children_of(pid: int) -> list:
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                out.append(int(p))
        except (OSError, ValueError):
            pass
    return out


def _kill_rest(job: dict, pgid: int) -> None:
    """Kill every process the case left behind, and reap them."""
    if job["pidns"]:
        for _ in range(3):  # pid 1 is spared by kill(-1); repeat for a fork racing the first one
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                break
            _reap_all()
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
    # As a subreaper we adopt orphans (also those that left the process group with setsid):
    # kill our children until none is left (bounded: a fork loop is capped by RLIMIT_NPROC).
    for _ in range(200):
        kids = _children_of(os.getpid())
        if not kids:
            break
        for k in kids:
            try:
                os.kill(k, signal.SIGKILL)
            except OSError:
                pass
        _reap_all()


def _reap_all() -> None:
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.001)


def _limits(job: dict, cpu_s: int, nproc: int):
    mem = job["memory_mb"] * 1024 * 1024

    def apply() -> None:
        if not job["pidns"]:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for res, val in ((resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)),
                         (resource.RLIMIT_AS, (mem, mem)),
                         (resource.RLIMIT_NPROC, (nproc, nproc)),
                         (resource.RLIMIT_FSIZE, (job["fsize_mb"] << 20,) * 2),
                         (resource.RLIMIT_NOFILE, (job["nofile"],) * 2),
                         (resource.RLIMIT_CORE, (0, 0))):
            resource.setrlimit(res, val)
    return apply


def _run_case(job: dict, work: str, stdin_data: bytes, limit_s: float, harness: bool) -> dict:
    path = os.path.join(work, ".stdin")
    with open(path, "wb") as f:
        f.write(stdin_data)
    stdin_fd = os.open(path, os.O_RDONLY)
    os.unlink(path)  # the program gets the open file, never a path to other cases' inputs
    py = job["python"]
    status_r, status_w = os.pipe()
    argv = [py, "-I", "-c", _HARNESS, str(status_w)] if harness else [py, "-I", "solution.py"]
    uid = job["uid"]
    kw = dict(user=uid, group=uid, extra_groups=[]) if uid is not None else {}
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=stdin_fd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=work, env=job["env"],
                                start_new_session=True, pass_fds=(status_w,),
                                preexec_fn=_limits(job, int(limit_s) + 1, job["nproc"]), **kw)
    finally:
        os.close(stdin_fd)
        os.close(status_w)
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(), status_r: bytearray()}
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    open_fds = set(bufs)
    deadline = t0 + limit_s
    why = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            why = "timeout"
            break
        if proc.poll() is not None:
            break
        watch = list(open_fds) + ([pidfd] if pidfd is not None else [])
        ready, _, _ = select.select(watch, [], [], left if pidfd is not None else min(left, 0.01))
        for fd in ready:
            if fd == pidfd:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            buf = bufs[fd]
            buf += chunk
            if fd == err_fd and len(buf) > 2 * _STDERR_KEEP:
                del buf[:-_STDERR_KEEP]
            elif fd == out_fd and len(buf) > job["output_cap"]:
                why = "output_limit"
        if why:
            break
    if why is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.kill()
    rc = proc.wait()
    elapsed = time.monotonic() - t0
    _kill_rest(job, proc.pid)
    # Everything is dead now, so what is left in the pipes ends with EOF.
    for fd in list(open_fds):
        while len(bufs[fd]) <= job["output_cap"]:
            r, _, _ = select.select([fd], [], [], 0.2)
            chunk = os.read(fd, 65536) if r else b""
            if not chunk:
                break
            bufs[fd] += chunk
    os.close(status_r)
    proc.stdout.close()
    proc.stderr.close()
    if pidfd is not None:
        os.close(pidfd)
    out = bytes(bufs[out_fd])
    if len(out) > job["output_cap"]:
        why = why or "output_limit"
    if why is None and rc in (-signal.SIGXCPU, -signal.SIGKILL) and elapsed >= limit_s * 0.9:
        why = "timeout"
    return {"rc": rc, "why": why, "stdout": out, "stderr": bytes(bufs[err_fd][-_STDERR_KEEP:]),
            "status": bytes(bufs[status_r]), "elapsed": elapsed}


def _normalise(text: str) -> list:
    return [line.rstrip() for line in text.rstrip().splitlines()]


def main() -> None:
    job = marshal.loads(sys.stdin.buffer.read())
    if not job["pidns"]:
        _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    work = _setup_mounts(job) if job["mounts"] else job["workdir"]
    with open(os.path.join(work, "solution.py"), "w") as f:
        f.write(job["program"])
    harness = job["tests"] is not None
    if harness:
        with open(os.path.join(work, "tests.py"), "w") as f:
            f.write(job["tests"])
    if job["uid"] is not None:
        os.chown(work, job["uid"], job["uid"])
        os.chmod(work, 0o700)
    cases = [None] if harness else job["inputs"]
    deadline = time.monotonic() + job["timeout_s"]
    results = []
    for i, case in enumerate(cases):
        left = deadline - time.monotonic()
        if left <= 0.01:
            results.append({"passed": False, "status": "timeout", "stderr": "not run: no time left"})
            continue
        # A fair share of what is left (a fast case leaves more time to the ones after it), but
        # at least a quarter of the whole: a uniformly slow program still passes the cases
        # that fit, instead of every case getting too short a slice.
        limit = min(left, max(left / (len(cases) - i), job["timeout_s"] / 4))
        if harness:
            nonce = os.urandom(16).hex()
            r = _run_case(job, work, (nonce + "\n").encode(), limit, True)
            ok = r["why"] is None and r["rc"] == 0 and r["status"].decode(errors="replace") == nonce
            matched = ok
        else:
            r = _run_case(job, work, case.encode(), limit, False)
            matched = (r["why"] is None and
                       _normalise(r["stdout"].decode(errors="replace")) ==
                       _normalise(job["outputs"][i]))
            ok = matched and r["rc"] == 0
        if ok:
            status = "ok"
        elif r["why"]:
            status = r["why"]
        elif r["rc"] != 0:
            status = "error"
        else:
            status = "failed"
        results.append({"passed": ok, "status": status, "rc": r["rc"],
                        "elapsed": round(r["elapsed"], 4),
                        "stdout_head": r["stdout"][:200].decode(errors="replace"),
                        "stderr": r["stderr"].decode(errors="replace")})
    sys.stdout.buffer.write(marshal.dumps({"cases": results}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
