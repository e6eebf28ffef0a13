"""Start a GenRM server (genrm/serve.py) as a child process, for the trainer and the tests.

    with launch("rule:addition") as server:
        ...  # POST server.url + "/chat/completions"

The child runs in its own session (its own process group) and gets SIGKILL when the thread that
started it exits (PR_SET_PDEATHSIG, Linux), so a crashed parent leaves no server behind. Its
stderr goes to a log file, never to a pipe nobody reads.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Sequence

from reasonrl_fast.errors import UserError
from reasonrl_fast.protocol import API_KEY_ENV
from reasonrl_fast.redact import REDACTED, hide, secrets_of

DEFAULT_MAX_BATCH = 64
"""Verdicts the hf backend generates in one batch, unless --max-batch says otherwise (the memory
planner counts their KV cache)."""

_PR_SET_PDEATHSIG = 1


class GenRMStartError(UserError, RuntimeError):
    """The server did not come up: bad backend, taken port, crash; the message holds its log's end."""

_LISTENING = re.compile(rb"GenRM server listening on http://(\S+):(\d+)/v1\n")


def _die_with_parent(parent: int):
    def preexec() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


class GenRMServer:
    """A running server child: `.url` ('http://127.0.0.1:PORT/v1'), `.port`, `.pid`, `.log_path`."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, log_path: str, own_log: bool = False) -> None:
        self.proc, self.host, self.port, self.log_path = proc, host, port, log_path
        self.pid, self.own_log = proc.pid, own_log

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL of the whole group if it has not exited within `timeout_s`. The
        temporary log (no `log_path` given) is removed after a clean exit, kept otherwise."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        clean = self.proc.returncode == 0
        self.kill()
        if clean and self.own_log:
            self._remove_log()

    def _remove_log(self) -> None:
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def kill(self) -> None:
        """SIGKILL the group now (for fault tests), and reap the child."""
        self._signal(signal.SIGKILL)
        self.proc.wait()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)  # the child leads its own group (start_new_session)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "GenRMServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - n))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _is_key_flag(arg: str) -> bool:
    """--api-key, or a prefix of it that argparse takes for it (--api, --api-k, ...)."""
    name = arg.partition("=")[0]
    return len(name) > 3 and "--api-key".startswith(name)


def _shown(cmd: Sequence[str]) -> str:
    """The command line as an error may show it: the value of --api-key REDACTED."""
    out, hide_next = [], False
    for arg in cmd:
        if hide_next:
            arg, hide_next = REDACTED, False
        elif _is_key_flag(arg):
            hide_next = "=" not in arg
            arg = arg.partition("=")[0] + ("" if hide_next else f"={REDACTED}")
        out.append(arg)
    return " ".join(out)


def _keys(api_key: str | None, args: Sequence[str]) -> list[str]:
    """Every API key this launch hands the server, for `hide`: `api_key` and any --api-key in
    `args`."""
    keys = [api_key or ""]
    for i, arg in enumerate(args):
        if _is_key_flag(arg):
            keys.append(arg.partition("=")[2] if "=" in arg else args[i + 1] if i + 1 < len(args) else "")
    return secrets_of([], *keys)


def launch(backend: str, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
           max_batch: int = DEFAULT_MAX_BATCH, extra_args: Sequence[str] = (), start_timeout_s: float = 60.0,
           log_path: str | None = None) -> GenRMServer:
    """Start `python -m reasonrl_fast.genrm.serve --backend BACKEND ...` and return once it
    answers GET /health; GenRMStartError with the end of its log if it exits or is not up within
    `start_timeout_s`. The API key travels in the environment, not on the command line;
    `api_key=None` serves without one, whatever this process's environment holds. No key, given
    either way, appears in an error (its command line or its log's end)."""
    own_log = log_path is None
    if own_log:
        fd, log_path = tempfile.mkstemp(prefix="genrm-serve-", suffix=".log")
        os.close(fd)
    cmd = [sys.executable, "-m", "reasonrl_fast.genrm.serve", "--backend", backend, "--host", host,
           "--port", str(port), "--max-batch", str(max_batch), *extra_args]
    env = dict(os.environ)
    # The child imports the same reasonrl_fast as this process, wherever its cwd is.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop(API_KEY_ENV, None)
    if api_key is not None:
        env[API_KEY_ENV] = api_key
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env,
                                start_new_session=True, preexec_fn=_die_with_parent(os.getpid()))
    server = GenRMServer(proc, host, 0, log_path, own_log)

    def fail(why: str) -> GenRMStartError:
        server.kill()
        proc.stdout.close()
        tail = _tail(log_path)
        if own_log:
            server._remove_log()
        where = "its log" if own_log else f"its log {log_path}"
        message = f"GenRM server ({_shown(cmd[1:])}) {why}; {where} ends with:\n{tail or '(empty)'}"
        return GenRMStartError(hide(message, _keys(api_key, cmd)))

    deadline = time.monotonic() + start_timeout_s
    buf = b""
    while True:
        m = _LISTENING.search(buf)
        if m:
            server.host, server.port = m.group(1).decode(), int(m.group(2))
            break
        left = deadline - time.monotonic()
        if left <= 0:
            raise fail(f"did not report listening within {start_timeout_s:.0f} s")
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:  # stdout closed: the child exited
                proc.wait(5)
                raise fail(f"exited with status {proc.returncode} before listening")
            buf += chunk
        elif proc.poll() is not None:
            raise fail(f"exited with status {proc.returncode} before listening")
    proc.stdout.close()  # the server sends later output to its log
    check = "127.0.0.1" if server.host in ("0.0.0.0", "") else server.host
    try:
        with urllib.request.urlopen(f"http://{check}:{server.port}/health",
                                    timeout=max(1.0, deadline - time.monotonic())) as r:
            health = json.loads(r.read())
        if health.get("status") != "ok":
            raise ValueError(f"/health answered {health}")
    except Exception as e:  # noqa: BLE001 - any failure of the check fails the launch
        raise fail(f"listens but GET /health failed ({type(e).__name__}: {e})") from None
    return server
