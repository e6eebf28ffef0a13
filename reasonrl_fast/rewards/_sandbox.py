"""The launcher that runs inside the sandbox (see code.py for the layers and who sets them up).

Started as a script (`python3 -I -S _sandbox.py`), standard library only. It reads one job
(a marshal-encoded dict from its caller: json would cost its imports, RESULTS §4) on stdin, runs
each case of the program with its limits, and writes one marshal-encoded result on stdout. In
the namespaced modes it is pid 1 of a fresh PID namespace: it builds the sandbox's root from
the caller's allow-list of host paths (bound read-only, then pivot_root: _setup_mounts), with
a private /dev and /tmp, writes the program into its own tmpfs, and after each case kills
every other process of the namespace (kill(-1)), so a program that setsid()s or daemonises
cannot outlive its case. In the plain mode it is a child subreaper and kills what it adopts.
In every mode it first joins a fresh session keyring, and it loads the caller's seccomp filter
(compiled BPF in the job) into each program and checker just before exec.
HumanEval-style tests: _run_checked, with the worker and checker scripts below.
"""

import ctypes
import errno
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
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS = 1, 4, 24, 28
_PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 36, 38
_SECBIT_NOROOT_LOCKED = 0x3  # uid 0 gains no capabilities at execve, for good
_SYS_MOUNT_SETATTR, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, 0x8000, 0x1
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x2, 0x4
_MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC, _MNT_DETACH = 8, 32, 4096, 16384, 2
# A mount's flags a remount keeps (statvfs's ST_ bits equal the MS_ ones): noexec, noatime,
# nodiratime, relatime.
_ST_KEPT = 8 | 1024 | 2048 | 4096
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_KEYCTL_JOIN_SESSION_KEYRING = 1
# The private /dev of the namespaced modes: these nodes (bound from the host's), the links.
_DEV_NODES = ("null", "zero", "full", "random", "urandom")
_DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
              ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"))
_STDERR_KEEP = 16384  # bytes of a case's stderr kept (the tail)
_FRAME_CAP = 16 << 20  # bytes of one answer from the program to the checker
# What an answer may hold (exact types: no subclass, so no __eq__ of the program's own).
_PLAIN = ("(type(None), bool, int, float, complex, str, bytes, list, tuple, set, frozenset, "
          "dict)")
# The checker's test of an answer after loading it (exact types only), pasted into _CHECKER.
_PLAIN_CHECK = """\
    plain_types = PLAIN

    def plain(v):
        t = type(v)
        if t not in plain_types:
            raise TypeError(f"the answer holds a {t.__name__}, which is not plain data")
        if t is dict:
            for k, x in v.items():
                plain(k)
                plain(x)
        elif t in (list, tuple, set, frozenset):
            for x in v:
                plain(x)
        return v
"""
# The worker's copy of an answer as plain data, pasted into _WORKER. A subclass of a plain type
# answers as its base type, rebuilt from its contents (Counter, OrderedDict, defaultdict: dict;
# a namedtuple: tuple; an IntEnum: int; numpy.float64: float): it equals what the base would,
# and the checker still takes exact types only, so nothing of the program's class (an __eq__
# that says yes) reaches the tests. Scalars are copied by their base type's own method, which
# a subclass cannot override, so an int subclass that equals anything arrives as the int it
# holds; bool cannot be subclassed and stays bool.
_PLAIN_COPY = """\
    plain_types = PLAIN
    plain_bases = (dict, list, tuple, set, frozenset, int, float, complex, str, bytes)
    plain_scalar = {int: int.__pos__, float: float.__pos__, complex: complex.__pos__,
                    str: str.__str__, bytes: lambda b: bytes.__getitem__(b, slice(None))}

    def plain(v):
        t = type(v)
        if t not in plain_types:
            t = next((b for b in plain_bases if issubclass(t, b)), None)
            if t is None:
                raise TypeError(f"the answer holds a {type(v).__name__}, which is not plain data")
            if t in plain_scalar:
                return plain_scalar[t](v)
        if t is dict:
            return {plain(k): plain(x) for k, x in v.items()}
        if t is list:
            return [plain(x) for x in v]
        if t is tuple:
            return tuple([plain(x) for x in v])
        if t is set:
            return {plain(x) for x in v}
        if t is frozenset:
            return frozenset([plain(x) for x in v])
        return v
"""
# An exception's traceback on stderr, pasted into both scripts. Not the traceback module: its
# import would make every failing sample slower than a passing one.
_REPORT = r"""
    def report(e, sources):
        out, tb = [], e.__traceback__
        while tb is not None:
            c = tb.tb_frame.f_code
            out.append(f'  File "{c.co_filename}", line {tb.tb_lineno}, in {c.co_name}\n')
            lines = sources.get(c.co_filename) or ()
            if 0 < tb.tb_lineno <= len(lines):
                out.append("    " + lines[tb.tb_lineno - 1].strip() + "\n")
            tb = tb.tb_next
        try:
            what = type(e).__name__ + (f": {e}" if str(e) else "")
            if e.__cause__ is not None:
                what += f" (from {type(e.__cause__).__name__}: {e.__cause__})"
        except BaseException:
            what = type(e).__name__
        text = "Traceback (most recent call last):\n" + "".join(out[-60:]) + what + "\n"
        data = text.encode(errors="replace")
        while data:
            data = data[os.write(2, data):]
"""

# HumanEval-style tests run in two interpreters. The program's (the worker, below) only
# computes: it runs the problem's own code (its prompt: imports, helpers), then solution.py, as
# HumanEval runs the prompt before the completion, then answers calls `name(*args, **kwargs)`
# from the checker with the result as plain data (marshal of the exact builtin types in _PLAIN,
# a subclass sent as its base type, which the checker checks again after loading; any other
# object is an error; json would cost both interpreters its imports, RESULTS §4). The checker
# (further below) runs the problem's code itself, then the tests, with a stand-in for the entry
# point and for every other name the tests take from the program, and alone writes the
# verdict, on a pipe only it holds. Whatever the program does to its own interpreter (builtins,
# exec, exit paths, frames, objects that equal anything) changes nothing but the answers it
# gives; it never sees the test source, and runs as another uid than the checker, or after the
# checker has made itself non-dumpable, so /proc gives it neither the checker's fds nor its
# memory.
_WORKER = r"""
def _serve():
    import marshal, os, sys
    req, resp = int(sys.argv[1]), int(sys.argv[2])

    def send(data):
        data = len(data).to_bytes(4, "big") + data
        while data:
            data = data[os.write(resp, data):]

    def recv(n):
        out = b""
        while len(out) < n:
            chunk = os.read(req, n - len(out))
            if not chunk:
                os._exit(0)
            out += chunk
        return out

PLAIN_COPY
REPORT
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    sources = {}
    try:
        # stdin: the problem's code (empty without one); the program then reads an empty stdin
        for name, src in (("prompt.py", sys.stdin.buffer.read().decode()), ("solution.py", None)):
            if src is None:
                with open(name) as f:
                    src = f.read()
            sources[name] = src.splitlines()
            exec(compile(src, name, "exec"), g)
    except BaseException as e:  # SystemExit too: the program ended before its tests ran
        report(e, sources)
        os._exit(1)
    sys.stdout.flush()
    send(b"loaded")
    while True:
        name, args, kwargs = marshal.loads(recv(int.from_bytes(recv(4), "big")))
        try:
            if name not in g:
                raise NameError(f"name {name!r} is not defined")
            data = marshal.dumps(("v", plain(g[name](*args, **kwargs))))
        except BaseException as e:
            data = marshal.dumps(("e", type(e).__name__, str(e)[:1000]))
        sys.stdout.flush()
        send(data)
_serve()
""".replace("REPORT", _REPORT).replace("PLAIN_COPY", _PLAIN_COPY).replace("PLAIN", _PLAIN)

_CHECKER = r"""
def _check():
    import builtins, marshal, os, sys
    req, resp, verdict, alone = (int(a) for a in sys.argv[1:5])
    theirs = set(filter(None, sys.argv[5].split(",")))  # the program's even if builtins
    if alone:  # the program will share our uid: no /proc/<us>/fd, mem, environ for it
        import ctypes
        if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")
    os.write(verdict, b"ready\n")
    prompt, src = marshal.loads(sys.stdin.buffer.read())  # the problem's code, the tests
    code = compile(src, "tests.py", "exec")
    names, todo = set(), [code]
    while todo:
        c = todo.pop()
        names.update(c.co_names)
        todo.extend(k for k in c.co_consts if isinstance(k, type(code)))

    def recv(n):
        out = b""
        while len(out) < n:
            chunk = os.read(resp, n - len(out))
            if not chunk:
                raise RuntimeError("the program ended before its tests did")
            out += chunk
        return out

    def frame():
        n = int.from_bytes(recv(4), "big")
        if n > CAP:
            raise RuntimeError(f"the program's answer is over {CAP} bytes")
        return recv(n)

PLAIN_CHECK
REPORT
    def stand_in(name):
        def call(*args, **kwargs):
            try:
                payload = marshal.dumps((name, args, kwargs))
            except ValueError:
                raise TypeError(f"{name}(): the tests passed a value that is not plain data")
            payload = len(payload).to_bytes(4, "big") + payload
            while payload:
                payload = payload[os.write(req, payload):]
            try:
                reply = plain(marshal.loads(frame()))
                if type(reply) is not tuple or reply[0] not in ("v", "e"):
                    raise TypeError("reply")
                if reply[0] == "v":
                    return reply[1]
                # The program's exception is raised here again only if it is an Exception that
                # ends no loop: a StopIteration raised in a test's all(map(candidate, ...)) or
                # filter(candidate, ...) would end it as if it were done, so it becomes a
                # RuntimeError, as in a generator (PEP 479); so does anything that is not an
                # Exception (SystemExit, KeyboardInterrupt, GeneratorExit).
                kind, msg = getattr(builtins, str(reply[1]), None), str(reply[2])[:1000]
                if not (isinstance(kind, type) and issubclass(kind, Exception)) or \
                        issubclass(kind, (StopIteration, StopAsyncIteration)):
                    msg = f"{name}() raised {str(reply[1])[:100]}" + (f": {msg}" if msg else "")
                    kind = RuntimeError
                err = kind(msg)
            except (ValueError, EOFError, TypeError, IndexError, RecursionError,
                    MemoryError) as e:
                raise RuntimeError(f"{name}(): the program's answer is not plain data") from e
            raise err
        call.__name__ = call.__qualname__ = name
        return call

    g = {"__name__": "__main__", "__builtins__": builtins}
    sources = {"prompt.py": prompt.splitlines(), "tests.py": src.splitlines()}
    try:
        # The problem's own code runs here (trusted data, like the tests): the helpers the tests
        # use from it (HumanEval/32's poly) are its own, whatever the program defines. From the
        # program come the entry point (its stub in the prompt replaced) and the names the
        # tests use that neither the prompt nor the builtins define.
        exec(compile(prompt, "prompt.py", "exec"), g)
        if frame() != b"loaded":
            raise RuntimeError("the program did not load (see its stderr)")
        g.update((n, stand_in(n)) for n in names
                 if n in theirs or not (n in g or hasattr(builtins, n)))
        exec(code, g)
    except BaseException as e:
        report(e, sources)
        os._exit(3 if isinstance(e, AssertionError) else 1)  # 3: a test failed; 1: an error
    os.write(verdict, b"pass\n")
_check()
""".replace("REPORT", _REPORT).replace("CAP", str(_FRAME_CAP)) \
    .replace("PLAIN_CHECK", _PLAIN_CHECK).replace("PLAIN", _PLAIN)
_VERDICT_PASS = b"ready\npass\n"


def _mount_tmpfs(target: str, opts: str, flags: int = _MS_NOSUID | _MS_NODEV) -> None:
    if _LIBC.mount(b"tmpfs", target.encode(), b"tmpfs", flags, opts.encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount tmpfs on {target}: {os.strerror(e)}")


def _mount(source, target: str, flags: int) -> None:
    if _LIBC.mount(source, target.encode(), None, flags, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {source!r} on {target}: {os.strerror(e)}")


def _read_only(root: str, mounts: list) -> None:
    """Every mount under `root` read-only, nosuid, nodev (the private /dev and /tmp come after,
    with their own flags), so nothing the program writes reaches the host: not a file the
    caller's uid owns (userns mode), nor a world-writable directory of a bound tree. Before
    Linux 5.12 (no mount_setattr), each mount in `mounts` is remounted on its own, keeping the
    flags it has (a user namespace may not clear those)."""
    class MountAttr(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in ("set", "clr", "prop", "userns")]
    attr = MountAttr(_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, 0, 0, 0)
    if _LIBC.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(-100), root.encode(),
                     ctypes.c_uint(_AT_RECURSIVE), ctypes.byref(attr),
                     ctypes.c_size_t(ctypes.sizeof(attr))) == 0:
        return
    e = ctypes.get_errno()
    if e != errno.ENOSYS:
        raise OSError(e, f"mount_setattr({root}, rdonly): {os.strerror(e)}")
    for target in [root] + mounts:
        kept = os.statvfs(target).f_flag & _ST_KEPT  # the statvfs bits are the MS_ ones
        _mount(None, target, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | kept)


def _private_dev(dev: str, held: dict, shm_opts: str) -> None:
    """A read-only tmpfs on `dev` holding only _DEV_NODES (the host's nodes in `held`, O_PATH
    descriptors taken while the host's /dev was in view), the _DEV_LINKS and a private shm/
    (a tmpfs of its own: `shm_opts`, capped in size and inodes). Every other device of the
    host is out of reach: a GPU's /dev/nvidia*, /dev/tty, /dev/ptmx, /dev/kmsg, /dev/log."""
    _mount_tmpfs(dev, "size=64k,nr_inodes=64,mode=755", _MS_NOSUID | _MS_NOEXEC)
    for name, fd in held.items():
        os.close(os.open(f"{dev}/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        _mount(f"/proc/self/fd/{fd}".encode(), f"{dev}/{name}", _MS_BIND)
    for name, target in _DEV_LINKS:
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm")
    _mount(None, dev, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC)
    _mount_tmpfs(f"{dev}/shm", shm_opts)


def _setup_mounts(job: dict) -> str:
    """The sandbox's file view, an allow-list (code.sandbox_view): a fresh root holding only
    what the job's plan names, bound read-only from the host, then pivot_root into it, so the
    rest of the host (home directories, the repository, training data anywhere, every
    package) is not hidden but absent. Returns the working directory (in the private /tmp).

    1. O_PATH descriptors on every host path to bind, taken while the host is in view.
    2. A tmpfs as the new root, mounted over /tmp (in this mount namespace only: the host's
       /tmp is untouched; the paths to bind are reached through the descriptors of 1).
    3. The plan, parents first: symbolic links made again (/lib64 -> usr/lib64), host paths
       bound at their real paths (recursive binds: a user namespace may not split a tree),
       an empty tmpfs over each site-packages inside them.
    4. /proc (the PID namespace's own, mounted by unshare) bound in; everything read-only.
    5. The private /dev (with its shm) and /tmp, writable and capped.
    6. pivot_root into the new root and detach the old one: no path leads back to the host."""
    root = "/tmp"
    held, fds = {}, {}
    try:
        for name in _DEV_NODES:
            try:
                held[name] = os.open("/dev/" + name, os.O_PATH)
            except FileNotFoundError:
                pass
        for op in job["view"]:
            if op[0] == "bind":
                fds[op[1]] = os.open(op[1], os.O_PATH)
        _mount_tmpfs(root, "size=1m,nr_inodes=4096,mode=755")
        mounts = []
        for op in job["view"]:
            where = root + op[1]
            if op[0] == "link":
                os.makedirs(os.path.dirname(where), exist_ok=True)
                os.symlink(op[2], where)
            elif op[0] == "bind":
                if op[2]:
                    os.makedirs(where, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(where), exist_ok=True)
                    os.close(os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444))
                _mount(f"/proc/self/fd/{fds[op[1]]}".encode(), where, _MS_BIND | _MS_REC)
                mounts.append(where)
            else:  # cover: an empty directory in place of site-packages
                _mount_tmpfs(where, "size=4k,nr_inodes=16,mode=755")
                mounts.append(where)
        for d in ("proc", "dev", "tmp"):
            os.mkdir(f"{root}/{d}", 0o755)
        _mount(b"/proc", root + "/proc", _MS_BIND | _MS_REC)
        mounts.append(root + "/proc")
        _read_only(root, mounts)
        _private_dev(root + "/dev", held, job["shm"])
    finally:
        for fd in list(held.values()) + list(fds.values()):
            os.close(fd)
    _mount_tmpfs(root + "/tmp", job["tmp"])
    os.chdir(root)
    if _LIBC.syscall(ctypes.c_long(job["sys_pivot_root"]), b".", b".") != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"pivot_root: {os.strerror(e)}")
    if _LIBC.umount2(b".", _MNT_DETACH) != 0:  # the old root, stacked on the new one
        e = ctypes.get_errno()
        raise OSError(e, f"umount2(old root): {os.strerror(e)}")
    os.chdir("/")
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


# Signals the launcher ignores (main): the program may send them to its parent or, in the
# userns mode (where it shares the launcher's uid), to pid 1, and a launcher stopped by one
# reports no verdict. Every process it starts gets them back as they were (_limits). The
# caller ends a sandbox with SIGKILL (its kill, unshare's --kill-child, the pdeathsig).
_IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _limits(job: dict, cpu_s: int, nproc: int):
    mem = job["memory_mb"] * 1024 * 1024

    def apply() -> None:
        for sig in _IGNORED_SIGNALS:  # an ignored signal stays ignored across exec
            signal.signal(sig, signal.SIG_DFL)
        if not job["pidns"]:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if job["drop_caps"]:  # userns: uid 0 of the namespace, but with no capability in it
            cap = 0
            while _LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
                cap += 1
            if _LIBC.prctl(_PR_SET_SECUREBITS, _SECBIT_NOROOT_LOCKED, 0, 0, 0) != 0:
                os._exit(126)
        if _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # no setuid binary helps
            os._exit(126)
        for res, val in ((resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)),
                         (resource.RLIMIT_AS, (mem, mem)),
                         (resource.RLIMIT_NPROC, (nproc, nproc)),
                         (resource.RLIMIT_FSIZE, (job["fsize_mb"] << 20,) * 2),
                         (resource.RLIMIT_NOFILE, (job["nofile"],) * 2),
                         (resource.RLIMIT_CORE, (0, 0))):
            resource.setrlimit(res, val)
        # Last, just before exec (needs no_new_privs): the seccomp filter (seccomp_filter.py).
        if _LIBC.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(job["seccomp_prog"]),
                       0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"prctl(PR_SET_SECCOMP): {os.strerror(e)}")  # fails the sandbox
    return apply


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _seccomp_prog(bpf: bytes) -> _SockFprog:
    """The struct prctl(PR_SET_SECCOMP) takes, over the caller's compiled filter (it keeps
    its buffer alive)."""
    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.addressof(buf))
    prog.buf = buf
    return prog


def _join_fresh_session_keyring(keyctl_nr: int) -> None:
    """A new anonymous session keyring for this process and all it starts: the caller's (and
    the keys in it) is inherited through fork, exec, unshare and setuid otherwise. Behind the
    seccomp filter, which refuses keyctl to the program and the checker outright. Not having
    keyrings at all (ENOSYS), or being refused keyctl itself (a container's filter, which then
    binds what we start too) leaves nothing to reach."""
    if _LIBC.syscall(ctypes.c_long(keyctl_nr), ctypes.c_long(_KEYCTL_JOIN_SESSION_KEYRING),
                     ctypes.c_void_p(None)) < 0:
        e = ctypes.get_errno()
        if e not in (errno.ENOSYS, errno.EPERM, errno.EACCES):
            raise OSError(e, f"keyctl(KEYCTL_JOIN_SESSION_KEYRING): {os.strerror(e)}")


def _spawn(job: dict, argv: list, uid, cwd: str, stdin: int, pass_fds: tuple, limit_s: float,
           nproc: int, home: str) -> subprocess.Popen:
    kw = dict(user=uid, group=uid, extra_groups=[]) if uid is not None else {}
    return subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=cwd, env=dict(job["env"], HOME=home), start_new_session=True,
                            pass_fds=pass_fds, preexec_fn=_limits(job, int(limit_s) + 1, nproc),
                            **kw)


def _unlinked_file(work: str, name: str, data: bytes) -> int:
    """An open read-only fd on `data` whose path is gone before any program starts."""
    path = os.path.join(work, name)
    try:  # a previous case's program may have left a link here for us to write through
        os.unlink(path)
    except FileNotFoundError:
        pass
    wfd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(wfd, "wb") as f:
        f.write(data)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    os.unlink(path)
    return fd


def _pump(job: dict, bufs: dict, out_fd: int, err_fds: set, done, deadline: float,
          wake) -> str | None:
    """Read the pipes in `bufs` until done() or the deadline; None, "timeout" or
    "output_limit". `wake` is a pidfd (or None) that turns readable when the process ends."""
    open_fds = set(bufs)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        if done():
            return None
        watch = list(open_fds) + ([wake] if wake is not None else [])
        ready, _, _ = select.select(watch, [], [], left if wake is not None else min(left, 0.01))
        for fd in ready:
            if fd == wake:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            buf = bufs[fd]
            buf += chunk
            if fd in err_fds and len(buf) > 2 * _STDERR_KEEP:
                del buf[:-_STDERR_KEEP]
            elif fd == out_fd and len(buf) > job["output_cap"]:
                return "output_limit"


def _pidfd(pid: int):
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _finish(job: dict, procs: list, bufs: dict) -> None:
    """Kill every process the case left, then read what is left in the pipes (it ends with
    EOF now that all writers are dead) and close them."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.kill()
    for p in procs:
        p.wait()
    _kill_rest(job, procs[0].pid)
    for fd, buf in bufs.items():
        while len(buf) <= job["output_cap"]:
            r, _, _ = select.select([fd], [], [], 0.2)
            chunk = os.read(fd, 65536) if r else b""
            if not chunk:
                break
            buf += chunk
        os.close(fd)


def _run_case(job: dict, work: str, stdin_data: bytes, limit_s: float) -> dict:
    """One stdin/stdout case: the program reads the case's input, its stdout is compared."""
    stdin_fd = _unlinked_file(work, ".stdin", stdin_data)
    t0 = time.monotonic()
    try:
        proc = _spawn(job, [job["python"], "-I", "solution.py"], job["uid"], work, stdin_fd, (),
                      limit_s, job["nproc"], work)
    finally:
        os.close(stdin_fd)
    wake = _pidfd(proc.pid)
    out_fd, err_fd = os.dup(proc.stdout.fileno()), os.dup(proc.stderr.fileno())
    proc.stdout.close()
    proc.stderr.close()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    why = _pump(job, bufs, out_fd, {err_fd}, lambda: proc.poll() is not None, t0 + limit_s, wake)
    _finish(job, [proc], bufs)
    if wake is not None:
        os.close(wake)
    elapsed = time.monotonic() - t0
    out = bytes(bufs[out_fd])
    if len(out) > job["output_cap"]:
        why = why or "output_limit"
    if why is None and proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL) \
            and elapsed >= limit_s * 0.9:
        why = "timeout"
    return {"rc": proc.returncode, "why": why, "stdout": out,
            "stderr": bytes(bufs[err_fd][-_STDERR_KEEP:]), "elapsed": elapsed}


def _run_checked(job: dict, work: str, limit_s: float) -> dict:
    """HumanEval-style tests: the checker runs them against the program in the worker (see
    _WORKER, _CHECKER). Passed only if the checker wrote its verdict and exited 0."""
    t0 = time.monotonic()
    deadline = t0 + limit_s
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    verdict_r, verdict_w = os.pipe()
    # The checker's stdin: the problem's code (run before the tests; "" without one) and the
    # tests; the worker's: the problem's code alone, which it runs before the program.
    prompt = job.get("prompt", "")
    tests_fd = _unlinked_file(work, ".tests", marshal.dumps((prompt, job["tests"])))
    alone = job["checker_uid"] is None  # the program will share the checker's uid
    procs, why, verdict = [], None, bytearray()
    bufs: dict = {}
    try:
        checker = _spawn(job, [job["python"], "-I", "-S", "-c", _CHECKER, str(req_w),
                               str(resp_r), str(verdict_w), str(int(alone)),
                               job["program_names"]],
                         job["checker_uid"], "/", tests_fd, (req_w, resp_r, verdict_w), limit_s,
                         job["checker_nproc"], "/")
        procs.append(checker)
        os.close(verdict_w)
        verdict_w = -1
        if alone:
            # The program starts only once the checker is out of its reach (non-dumpable).
            while not verdict.endswith(b"\n") and time.monotonic() < deadline:
                r, _, _ = select.select([verdict_r], [], [], max(0.0, deadline - time.monotonic()))
                chunk = os.read(verdict_r, 64) if r else b""
                if not chunk:
                    break
                verdict += chunk
            if bytes(verdict) != b"ready\n":
                why = "timeout" if time.monotonic() >= deadline else "sandbox_error"
        if why is None:
            stdin = (_unlinked_file(work, ".prompt", prompt.encode()) if prompt
                     else os.open(os.devnull, os.O_RDONLY))
            try:
                worker = _spawn(job, [job["python"], "-I", "-c", _WORKER, str(req_r),
                                      str(resp_w)], job["uid"], work, stdin, (req_r, resp_w),
                                max(0.0, deadline - time.monotonic()), job["nproc"], work)
            finally:
                os.close(stdin)
            procs.append(worker)
    finally:
        os.close(tests_fd)
        for fd in (req_r, req_w, resp_r, resp_w, verdict_w):
            if fd >= 0:
                os.close(fd)
    for p in procs:
        for f in (p.stdout, p.stderr):
            bufs[os.dup(f.fileno())] = bytearray()
            f.close()
    # The checker's stdout and stderr, then (if it started) the worker's: only the program's
    # stdout counts against the output cap; the verdict pipe is read beside them.
    fds = list(bufs)
    out_fd = fds[2] if len(fds) == 4 else -1
    bufs[verdict_r] = verdict
    wake = _pidfd(checker.pid)
    if why is None:
        why = _pump(job, bufs, out_fd, set(fds) - {out_fd},
                    lambda: checker.poll() is not None, deadline, wake)
    _finish(job, procs, bufs)
    if wake is not None:
        os.close(wake)
    elapsed = time.monotonic() - t0
    if why is None and checker.returncode in (-signal.SIGXCPU, -signal.SIGKILL) \
            and elapsed >= limit_s * 0.9:
        why = "timeout"
    ok = why is None and checker.returncode == 0 and bytes(verdict) == _VERDICT_PASS
    failed = why is None and checker.returncode == 3
    # What the program wrote to stderr, then the checker's account of the failure.
    err = (bytes(bufs[fds[3]]) if len(fds) == 4 else b"") + bytes(bufs[fds[1]])
    return {"rc": checker.returncode, "why": why, "ok": ok, "failed": failed,
            "stdout": bytes(bufs[out_fd]) if out_fd >= 0 else b"",
            "stderr": err[-_STDERR_KEEP:], "elapsed": elapsed}


def _normalise(text: str) -> list:
    return [line.rstrip() for line in text.rstrip().splitlines()]


def main() -> None:
    # Nothing in the sandbox may read this process's memory (the job: tests, expected output).
    _LIBC.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    for sig in _IGNORED_SIGNALS:  # nothing in the sandbox stops the verdict with a signal
        signal.signal(sig, signal.SIG_IGN)
    job = marshal.loads(sys.stdin.buffer.read())
    _join_fresh_session_keyring(job["sys_keyctl"])
    job["seccomp_prog"] = _seccomp_prog(job["seccomp"])
    if not job["pidns"]:
        _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    work = _setup_mounts(job) if job["mounts"] else job["workdir"]
    with open(os.path.join(work, "solution.py"), "w") as f:
        f.write(job["program"])
    if job["uid"] is not None:
        os.chown(work, job["uid"], job["uid"])
        os.chown(os.path.join(work, "solution.py"), job["uid"], job["uid"])
        os.chmod(work, 0o700)
    checked = job["tests"] is not None
    cases = [None] if checked else job["inputs"]
    deadline = time.monotonic() + job["timeout_s"]
    results = []
    for i, case in enumerate(cases):
        left = deadline - time.monotonic()
        if left <= 0.01:
            results.append({"passed": False, "status": "timeout",
                            "stderr": "not run: no time left"})
            continue
        # A fair share of what is left (a fast case leaves more time to the ones after it), but
        # at least a quarter of the whole: a uniformly slow program still passes the cases
        # that fit, instead of every case getting too short a slice.
        limit = min(left, max(left / (len(cases) - i), job["timeout_s"] / 4))
        if checked:
            r = _run_checked(job, work, limit)
            ok = r["ok"]
        else:
            r = _run_case(job, work, case.encode(), limit)
            if job.get("run"):  # a run, not a test (code.py run_program): its output is the answer
                ok = r["why"] is None and r["rc"] == 0
            else:
                matched = (r["why"] is None and
                           _normalise(r["stdout"].decode(errors="replace")) ==
                           _normalise(job["outputs"][i]))
                ok = matched and r["rc"] == 0
        if ok:
            status = "ok"
        elif r["why"]:
            status = r["why"]
        elif r["rc"] != 0 and not r.get("failed"):
            status = "error"
        else:
            status = "failed"
        results.append({"passed": ok, "status": status, "rc": r["rc"],
                        "elapsed": round(r["elapsed"], 4),
                        "stdout_head": r["stdout"][:job.get("stdout_keep", 200)].decode(errors="replace"),
                        "stderr": r["stderr"].decode(errors="replace")})
    sys.stdout.buffer.write(marshal.dumps({"cases": results}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
