"""The error-path check of the compiled extension: every documented error type raised from every
op schema, on CPU and (when present) CUDA, in a child process that cannot take the caller down.

    python -m reasonrl_fast.errpath                  # cpu, and cuda when available
    python -m reasonrl_fast.errpath --device cuda --timeout 60 --json result.json
    python -m reasonrl_fast.errpath --library build/x/_C.so   # a build other than the installed one

Why it exists: the ops' argument checks (csrc/checks.h) format their messages and throw inside
`_C.so`, and libtorch catches the exception and turns it into a Python ValueError, TypeError,
IndexError or RuntimeError. That hand-over works only when `_C.so` and torch share one C++
runtime. A `_C.so` that carries its own (linked with -static-libstdc++) throws from a private
runtime: messages come out cut at their first number, and anything from a crash to a hang may
follow. So this check asserts each case's exception type and its whole message, numbers
included, then raises from several threads at once, and names what went wrong:
  - a crash by its signal (SIGSEGV, SIGABRT, ...), with the case in flight and the stacks
    faulthandler printed;
  - a hang by the case in flight, the Python stacks (faulthandler) and the native ones (gdb,
    eu-stack or py-spy when installed; the kernel's view from /proc otherwise), then it is killed;
  - in every failure, the ELF facts of the `_C.so` that was loaded and, when it carries its own
    C++ runtime, that cause and its fix (reasonrl_fast/toolchain.py).
Exit status: 0 when every device passed, 1 otherwise, 2 for bad arguments.

The CUDA kernels' device-side check (a target id outside the vocabulary is a device assertion,
which ends the CUDA context) is not raised here: the op tests cover it in a process of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Optional

from reasonrl_fast.cli import positive_number

# ---------------------------------------------------------------------------------- the cases


def _cases(torch, dev: str) -> list[tuple[str, type, str, Callable[[], object]]]:
    """(name, exception type, the whole first line of its message as a regex, call). Each message
    carries formatted numbers or shapes: a broken runtime cuts a message at its first number."""
    o = torch.ops.reasonrl_fast
    f32 = dict(device=dev, dtype=torch.float32)
    i64 = dict(device=dev, dtype=torch.long)
    z, ones = (lambda *s, **k: torch.zeros(*s, **{**f32, **k})), (lambda *s: torch.ones(*s, **f32))
    lp = (z(3, 2), z(3, 2), z(3, 2))  # logprob, ref, old [B=3, T=2]
    cases = [
        ("token_logprob/shape", ValueError,
         re.escape("token_logprob: target shape [4] must equal the logits shape without its last dimension [3, 5]"),
         lambda: o.token_logprob(z(3, 5), z(4, **i64), 1.0, -100, False)),
        ("token_logprob/logits dtype", TypeError,
         re.escape("token_logprob: logits must be floating point, got Long"),
         lambda: o.token_logprob(z(3, 5, dtype=torch.long), z(3, **i64), 1.0, -100, False)),
        ("token_logprob/target dtype", TypeError,
         re.escape("token_logprob: target ids must be an integer tensor, got Float"),
         lambda: o.token_logprob(z(3, 5), z(3), 1.0, -100, False)),
        ("token_logprob/temperature", ValueError,
         re.escape("token_logprob: temperature must be a positive finite number, got -1.5"),
         lambda: o.token_logprob(z(3, 5), z(3, **i64), -1.5, -100, False)),
        ("token_logprob/temperature underflow", ValueError,
         re.escape("token_logprob: temperature 1e-300 is below 1.17549e-38, the smallest that float32 "
                   "accumulation supports (1/temperature overflows)"),
         lambda: o.token_logprob(z(3, 5), z(3, **i64), 1e-300, -100, False)),
        ("token_logprob/leading dims", RuntimeError,
         re.escape("reasonrl_fast: at most 12 leading dimensions"),
         lambda: o.token_logprob(z(*[1] * 12, 5), z(*[1] * 12, **i64), 1.0, -100, False)),
        ("token_logprob_backward/lse dtype", TypeError,
         re.escape("token_logprob_backward: lse must be Float (as the forward returns it for Float logits), got Double"),
         lambda: o.token_logprob_backward(z(3), None, z(3, 5), z(3, **i64), z(3, dtype=torch.double), z(0),
                                          1.0, -100)),
        ("token_logprob_backward/lse shape", ValueError,
         re.escape("token_logprob_backward: lse must have the target's shape [3], got [2]"),
         lambda: o.token_logprob_backward(z(3), None, z(3, 5), z(3, **i64), z(2), z(0), 1.0, -100)),
        ("token_logprob_backward_/overlapping logits", ValueError,
         re.escape("token_logprob: inplace_backward needs logits whose elements do not share memory (shape "
                   "[3, 5], strides [0, 1]); pass a contiguous copy or use inplace_backward=False"),
         lambda: o.token_logprob_backward_(z(3), None, z(1, 5).expand(3, 5), z(3, **i64), z(3), z(0), 1.0, -100)),
        ("group_advantage/rewards shape", ValueError,
         re.escape("group_advantage: rewards must be 1-D [B], got shape [2, 3]"),
         lambda: o.group_advantage(z(2, 3), z(6, **i64), 1e-6, True)),
        ("group_advantage/group_ids dtype", TypeError,
         re.escape("group_advantage: group_ids must be an integer tensor, got Float"),
         lambda: o.group_advantage(z(3), z(3), 1e-6, True)),
        ("group_advantage/eps", ValueError,
         re.escape("group_advantage: eps must be >= 0, got -0.25"),
         lambda: o.group_advantage(z(3), z(3, **i64), -0.25, True)),
        ("tb_loss/log_z shape", ValueError,
         re.escape("tb_loss: log_z must be [B] = [3], got shape [4]"),
         lambda: o.tb_loss(z(4), *lp, z(3), ones(3, 2), 1.0, 0.0, 1.0)),
        ("tb_loss/weights", ValueError,
         re.escape("tb_loss: min_is_weight 2.5 > max_is_weight 0.5"),
         lambda: o.tb_loss(z(3), *lp, z(3), ones(3, 2), 1.0, 2.5, 0.5)),
        ("tb_loss_backward/grad_loss", ValueError,
         re.escape("tb_loss_backward: grad_loss must be a scalar, got shape [2]"),
         lambda: o.tb_loss_backward(z(2), z(3), z(3), ones(3, 2))),
        ("masked_mean/x shape", ValueError,
         re.escape("masked_mean: hidden states must be [B, T, H], got shape [3, 4]"),
         lambda: o.masked_mean(z(3, 4), ones(3, 4))),
        ("masked_mean_backward/grad shape", ValueError,
         re.escape("masked_mean_backward: grad must be [B, H], got shape [2, 3, 4]"),
         lambda: o.masked_mean_backward(z(2, 3, 4), ones(2, 3))),
    ]
    if dev == "cpu":  # on CUDA this is a device-side assertion (see the module docstring)
        cases.append(("token_logprob/target id", IndexError,
                      re.escape("token_logprob: target id 7 at flat position 1 is outside the vocabulary [0, 5) "
                                "and is not ignore_index (-100)"),
                      lambda: o.token_logprob(z(3, 5), torch.tensor([0, 7, 1], **i64), 1.0, -100, False)))
    else:
        cases.append(("token_logprob/devices", ValueError,
                      re.escape("token_logprob: target and logits must be on one device, got target on cpu and "
                                "logits on ") + r"cuda(:\d+)?",
                      lambda: o.token_logprob(z(3, 5), torch.zeros(3, dtype=torch.long), 1.0, -100, False)))
    return cases


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0]


def _check(name: str, etype: type, pattern: str, call: Callable[[], object]) -> Optional[str]:
    """None when `call` raised `etype` with the whole expected message, else what happened."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 (the type is what is checked)
        msg = _first_line(e)
        if type(e) is not etype:
            return f"{name}: raised {type(e).__name__} ({msg[:200]!r}), expected {etype.__name__}"
        if not re.fullmatch(pattern, msg):
            return f"{name}: message {msg[:300]!r} is not the expected one (cut or garbled?)"
        return None
    return f"{name}: raised nothing, expected {etype.__name__}"


def _stress(torch, dev: str, threads: int, repeat: int) -> list[str]:
    """`threads` threads each raise `repeat` tb_loss shape errors with varying numbers at once:
    the runtime's formatting and exception state under concurrency."""
    o = torch.ops.reasonrl_fast
    bad: list[str] = []

    def work(k: int) -> None:
        for i in range(repeat):
            B = 1 + (k * repeat + i) % 97
            lp = torch.zeros(B, 2, device=dev)
            err = _check(f"thread {k} #{i}", ValueError, re.escape(f"tb_loss: log_z must be [B] = [{B}], got shape [{B + 1}]"),
                         lambda: o.tb_loss(torch.zeros(B + 1, device=dev), lp, lp, lp, torch.zeros(B, device=dev),
                                           torch.ones(B, 2, device=dev), 1.0, 0.0, 1.0))
            if err:
                bad.append(err)
                return

    ts = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return bad


def child(dev: str, library: Optional[str], threads: int, repeat: int) -> int:
    """Runs in the child: one JSON line per event on stdout ({"start": case} before each case, so
    that the parent knows the case in flight when the process dies or hangs)."""
    import torch

    def emit(**kv) -> None:
        print(json.dumps(kv), flush=True)

    emit(start="loading the library")
    if library:
        torch.ops.load_library(library)
        so = os.path.abspath(library)
    else:
        from reasonrl_fast import _C

        so = os.path.abspath(_C.__file__)
    emit(library=so, torch=torch.__version__)
    if dev == "cuda":
        if not torch.cuda.is_available():
            emit(skipped="no CUDA")
            return 0
        torch.zeros(1, device="cuda")  # the context first, so its cost is not any case's
    for name, etype, pattern, call in _cases(torch, dev):
        emit(start=name)
        emit(case=name, error=_check(name, etype, pattern, call))
    emit(start=f"{threads} threads x {repeat} raises")
    emit(case="threads", error="; ".join(_stress(torch, dev, threads, repeat)[:3]) or None)
    emit(done=True)
    return 0


# ---------------------------------------------------------------------------------- the parent


def native_stacks(pid: int, timeout: float = 20.0) -> str:
    """The native stacks of a live process: gdb, eu-stack or py-spy where installed; otherwise the
    kernel's view of each thread from /proc (what it waits in), which needs no tool."""
    tools = [("gdb", ["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt"]),
             ("eu-stack", ["eu-stack", "-p", str(pid)]),
             ("py-spy", ["py-spy", "dump", "--native", "--pid", str(pid)])]
    for name, cmd in tools:
        if shutil.which(cmd[0]):
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                if r.returncode == 0 and r.stdout.strip():
                    return f"[{name}]\n{r.stdout}"
            except (OSError, subprocess.TimeoutExpired):
                pass
    out = ["[/proc: no gdb, eu-stack or py-spy here; each thread's wait channel, syscall and kernel stack]"]
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int) if os.path.isdir(f"/proc/{pid}/task") else []:
        facts = []
        for f in ("comm", "wchan", "syscall", "stack"):
            try:
                with open(f"/proc/{pid}/task/{tid}/{f}") as fh:
                    facts.append(f"{f}: {fh.read().strip()}")
            except OSError:
                pass
        out.append(f"thread {tid}: " + " | ".join(facts))
    return "\n".join(out)


def _cause(so: Optional[str]) -> tuple[dict, Optional[str]]:
    """The loaded library's ELF facts and, when it carries its own C++ runtime, the cause."""
    from reasonrl_fast import toolchain

    if not so or not os.path.exists(so):
        return {}, None
    try:
        facts = toolchain.elf_facts(so)
    except Exception as e:  # noqa: BLE001 (a diagnostic must not fail on its own diagnosis)
        return {"error": str(e)}, None
    return facts, toolchain.private_runtime_problem(facts)


def run_device(dev: str, timeout: float, library: Optional[str], threads: int, repeat: int) -> dict:
    """Run the child for one device and read what it says. Returns {device, status, passed,
    failures, in_flight, signal, stderr, native_stacks, library, elf, cause}; status is one of
    ok, failed, crashed, hung, skipped."""
    cmd = [sys.executable, "-X", "faulthandler", "-m", "reasonrl_fast.errpath", "--child", dev,
           "--threads", str(threads), "--repeat", str(repeat)] + (["--library", library] if library else [])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # faulthandler prints every thread's Python stack shortly before the parent's limit
    env["REASONRL_ERRPATH_DUMP_S"] = str(max(1.0, timeout - 3))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    lines: list[str] = []
    err_chunks: list[str] = []
    readers = [threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True),
               threading.Thread(target=lambda: err_chunks.extend(iter(proc.stderr.readline, "")), daemon=True)]
    for r in readers:
        r.start()
    hung, stacks = False, None
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        hung = True
        time.sleep(0.5)  # let faulthandler's dump land
        stacks = native_stacks(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    for r in readers:
        r.join(timeout=5)
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    res = {"device": dev, "seconds": round(time.monotonic() - t0, 1), "passed": 0, "failures": [],
           "in_flight": None, "signal": None, "native_stacks": stacks, "library": None, "torch": None,
           "stderr": "".join(err_chunks)[-6000:]}
    done = skipped = False
    for ev in events:
        if "library" in ev:
            res["library"], res["torch"], res["in_flight"] = ev["library"], ev.get("torch"), None
        elif "start" in ev:
            res["in_flight"] = ev["start"]
        elif "case" in ev:
            res["in_flight"] = None
            if ev["error"]:
                res["failures"].append(ev["error"])
            else:
                res["passed"] += 1
        elif "skipped" in ev:
            skipped, res["reason"] = True, ev["skipped"]
        elif ev.get("done"):
            done = True
    if hung:
        res["status"] = "hung"
    elif rc is not None and rc < 0:
        res["status"], res["signal"] = "crashed", signal.Signals(-rc).name
    elif skipped:
        res["status"] = "skipped"
    elif rc != 0 or not done or res["failures"]:
        res["status"] = "failed"
        if rc != 0:
            res["failures"].append(f"the child exited with status {rc}")
    else:
        res["status"] = "ok"
    if res["status"] not in ("ok", "skipped"):
        res["elf"], res["cause"] = _cause(res["library"] or library)
    return res


def summary(res: dict) -> str:
    """A few lines per device that name what happened."""
    dev, st = res["device"], res["status"]
    if st == "ok":
        return f"{dev}: ok, {res['passed']} cases in {res['seconds']} s ({res['library']})"
    if st == "skipped":
        return f"{dev}: skipped ({res.get('reason')})"
    head = {"crashed": f"crashed with {res['signal']}", "hung": f"hung (killed after {res['seconds']} s)",
            "failed": f"{len(res['failures'])} failure(s)"}[st]
    out = [f"{dev}: {head}; {res['passed']} cases passed"
           + (f"; in flight: {res['in_flight']}" if res["in_flight"] else "")]
    out += [f"  - {f}" for f in res["failures"][:10]]
    if res.get("cause"):
        out.append(f"  cause: {res['cause']}")
    if st in ("crashed", "hung") and res["stderr"].strip():
        out.append("  stderr (faulthandler):\n" + "\n".join("    " + x for x in res["stderr"].strip().splitlines()[-40:]))
    if res.get("native_stacks"):
        out.append("  native stacks:\n" + "\n".join("    " + x for x in res["native_stacks"].splitlines()[:120]))
    return "\n".join(out)


def check(devices: list[str], timeout: float = 60.0, library: Optional[str] = None, threads: int = 5,
          repeat: int = 400) -> list[dict]:
    return [run_device(d, timeout, library, threads, repeat) for d in devices]


def _cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reasonrl_fast.errpath", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "all"], default="auto",
                   help="auto: cpu, and cuda when present; all: cpu and cuda (cuda skipped without a GPU)")
    p.add_argument("--timeout", type=positive_number, default=60.0, help="seconds per device before the child counts as hung")
    p.add_argument("--library", help="load this _C.so instead of the installed reasonrl_fast._C")
    p.add_argument("--threads", type=int, default=5)
    p.add_argument("--repeat", type=int, default=400, help="raises per thread")
    p.add_argument("--json", metavar="PATH", help="write the results there")
    p.add_argument("--child", choices=["cpu", "cuda"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.threads < 1 or a.repeat < 0:
        p.error("--threads must be >= 1, --repeat >= 0")
    if a.library and not os.path.isfile(a.library):
        p.error(f"--library {a.library}: no such file")
    if a.child:
        dump = float(os.environ.get("REASONRL_ERRPATH_DUMP_S", "0"))
        if dump > 0:
            import faulthandler

            faulthandler.dump_traceback_later(dump, exit=False)
        return child(a.child, a.library, a.threads, a.repeat)
    devices = {"cpu": ["cpu"], "cuda": ["cuda"], "all": ["cpu", "cuda"]}.get(a.device)
    if devices is None:
        devices = ["cpu", "cuda"] if _cuda_present() else ["cpu"]
    results = check(devices, a.timeout, a.library, a.threads, a.repeat)
    for r in results:
        print(summary(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["status"] in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
