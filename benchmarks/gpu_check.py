"""The check of a GPU machine (`make gpu-check`): everything a first run on a card must tell, in one
call that ends inside its budget (default 8 minutes), with every failure and hang named.

    python benchmarks/gpu_check.py --quick               # one size per benchmark: the one-call check
    python benchmarks/gpu_check.py --budget 1200         # the full benchmark sweep (autotuned)
    python benchmarks/gpu_check.py --wheels DIR          # first install the wheels in DIR (no network)
    python benchmarks/gpu_check.py --write benchmarks/RESULTS.md   # also the "GPU" section there

Steps, in this order; a failed step is recorded and the next one still runs:
  wheels     (--wheels DIR) `pip install --no-index --no-deps --target TMP DIR/*.whl`, TMP put on
             the PYTHONPATH of every later step;
  build      `setup.py build_ext --inplace` with FORCE_CUDA=1, CUDA_HOME (default /usr/local/cuda),
             MAX_JOBS = all cores, TORCH_CUDA_ARCH_LIST = the card's compute capability, and the
             environment's CC/CXX, or the system pair when a test link shows the environment's
             compiler would give `_C.so` a C++ runtime of its own (choose_pair); setup.py prints
             the pair it builds with (reasonrl_fast/toolchain.py);
  import     which `_C.so` a fresh interpreter loads, its ELF facts (NEEDED, .comment, whether it
             defines its own C++ runtime) and whether it has CUDA kernels;
  errpath    `python -m reasonrl_fast.errpath`: every documented error from every op schema, CPU
             and CUDA, in a child with a hard limit (a crash named by its signal, a hang by its
             stacks);
  tests      `pytest tests/ops -v` (CUDA kernels, compiled Triton, and the CPU kernels beside them)
             with pytest-timeout's thread method, a faulthandler timeout and a junit XML: every
             failed, crashed or hung test is named in the results even when the step is cut;
  smoke      benchmarks/gpu_smoke.py: two trainer steps on the GPU (FSDP2 over NCCL, fused LM
             head, the embedded model in bf16);
  rl-step    benchmarks/gpu_step.py: the whole RL step's throughput (a warm-up and two timed steps
             of a Qwen2.5-0.5B-shaped model with the recipes' settings, 128 sequences of 512
             tokens): rollout and update tokens/s, step time, peak memory, MFU beside prime-rl's
             figure (its numbers in gpu_check.md and, whole, in gpu_check.json);
  plan-truth benchmarks/plan_truth.py: two trainer steps of a Qwen2.5-0.5B-shaped model with the
             recipes' settings, each phase's peak allocated memory beside the memory planner's
             terms (plan_truth.json and plan_truth.md; its table also in gpu_check.md);
  bench X    each per-op benchmark with --device DEVICE (and --quick: one size, Triton autotuning
             off, the first tile candidate, and no torch.compile provider; the full sweep
             autotunes, cached by Triton, and compiles).
Without CUDA (a CPU machine, or a GPU the driver does not show) build, tests, smoke, rl-step,
plan-truth and the GPU benchmarks are recorded as "skipped: no CUDA" and the rest runs: the whole check is
exercised on CPU. With --device cpu the benchmarks run their CPU cases instead, and with
--plan-truth-cpu the plan-truth step its CPU smoke run.

The budget is the call's: each step runs within min(its own cap, what is left minus the minimum
reserved for every later step), so a slow build cannot starve the tests. The results land in one
folder (--out, default benchmarks/gpu_results/<card>-<date>): gpu_check.log (every step's whole
output), gpu_check.md and gpu_check.json (git commit and dirty flag, compilers, nvcc and its host
compiler, the `_C.so` ELF facts, torch/triton versions, card, clocks and power, each step with its
status, limit and time, every failed test, the error-path and smoke results, the benchmark
tables), junit.xml, errpath.json, plan_truth.json and plan_truth.md. Exit status 0 only when every
step that ran succeeded (plan-truth succeeds when it ran: whether the planner agreed is in its
summary).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
from typing import Optional

from checkout import HERE, ROOT

BENCHMARKS = ["token_logprob", "linear_token_logprob", "group_advantage", "tb_loss", "masked_mean"]
# (seconds reserved at least, cap) per step: a step never takes the reserve of the steps after it
# (on an H100, 2026-11-27: build 54 s, import 5 s, errpath 12 s; the op tests did not finish in 93 s
# with two of them hung; the smoke run's first rollout took over 30 s with CUDA's first use in it;
# rl-step's and plan-truth's caps are sized for the 0.5B model's build, setup and their steps, not yet
# timed on a card)
LIMITS = {"wheels": (10, 120), "build": (60, 300), "import": (10, 60), "errpath": (15, 120),
          "tests": (90, 300), "smoke": (60, 180), "rl-step": (40, 120), "plan-truth": (45, 90), "bench": (30, 150)}
NO_CUDA = "skipped: no CUDA"
INTERRUPT_GRACE_S = 10.0  # from a step's SIGINT at its limit to the SIGKILL

_LOG = None  # the check's log file: every line printed also goes there


def log(msg: str) -> None:
    line = f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    if _LOG:
        _LOG.write(line + "\n")
        _LOG.flush()


def _echo(line: str) -> None:
    print(f"  | {line}", flush=True)
    if _LOG:
        _LOG.write(f"  | {line}\n")
        _LOG.flush()


_DEADLINE = float("inf")  # the whole check's end (--budget): no step runs past it
_PLAN: list[str] = []  # the kinds of the steps still to run, for the reserves


def step_limit(kind: str) -> float:
    """This step's limit: its cap, within what is left after the reserves of the later steps."""
    _PLAN.remove(kind)
    lo, cap = LIMITS[kind]
    left = _DEADLINE - time.monotonic()
    later = sum(LIMITS[k][0] for k in _PLAN)
    return max(min(cap, left - later), min(lo, left))


def skipped(name: str, why: str) -> dict:
    log(f"{name}: {why}")
    return {"name": name, "cmd": [], "rc": None, "seconds": 0.0, "limit": None, "status": why, "tail": []}


def _take_interrupts() -> None:
    """In a step's child before its exec: SIGINT as a terminal gives it. A check started in the
    background by a shell (`make gpu-check &`, nohup) ignores SIGINT, a child inherits that, and
    the step's interrupt would then do nothing: it would be killed at the grace's end without its
    summary."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_step(name: str, cmd: list[str], env: dict, timeout: float, cwd: str = ROOT) -> dict:
    """Run cmd, echoing its output as it comes; kill its process group past `timeout` seconds
    (or the check's deadline, whichever comes first): SIGINT first, so that pytest still writes
    its summary and junit XML, then SIGKILL INTERRUPT_GRACE_S later. Returns {name, cmd, rc, seconds, limit,
    status, tail}."""
    left = _DEADLINE - time.monotonic()
    if left < 5:
        log(f"{name}: skipped, the check's budget is spent")
        return {"name": name, "cmd": cmd, "rc": None, "seconds": 0.0, "limit": None, "status": "skipped: budget spent",
                "tail": []}
    timeout = min(timeout, left)
    log(f"{name}: {shlex.join(cmd)[:400]} (limit {timeout:.0f} s)")
    t0 = time.monotonic()
    tail: list[str] = []
    status = "ok"
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_take_interrupts)
    except OSError as e:
        return {"name": name, "cmd": cmd, "rc": None, "seconds": 0.0, "limit": round(timeout), "status":
                f"failed to start: {e}", "tail": []}
    deadline = t0 + timeout
    fd, pending = proc.stdout.fileno(), b""
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    interrupted = False

    def take(chunk: bytes) -> None:
        nonlocal pending, tail
        *lines, pending = (pending + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace").rstrip()
            _echo(line)
            tail = (tail + [line])[-40:]

    while True:
        left = deadline - time.monotonic()
        if left <= 0 and not interrupted:
            os.killpg(proc.pid, signal.SIGINT)
            status, interrupted, deadline = f"timed out after {timeout:.0f} s", True, time.monotonic() + INTERRUPT_GRACE_S
            continue
        if left <= 0:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        if not sel.select(timeout=min(left, 1.0)):
            if proc.poll() is not None:  # exited; a leftover grandchild may hold the pipe open
                break
            continue
        chunk = os.read(fd, 65536)  # never blocks on a line left unfinished by a hung child
        if not chunk:
            break
        take(chunk)
    # The child's last lines (its traceback, pytest's summary) may have reached the pipe after
    # the last select: read what is there without waiting on a grandchild that holds it open.
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, 65536):
            take(chunk)
    except BlockingIOError:
        pass
    if pending.strip():
        tail = (tail + [pending.decode(errors="replace").rstrip()])[-40:]
    rc = proc.wait()
    sel.close()
    proc.stdout.close()
    secs = time.monotonic() - t0
    if status == "ok" and rc != 0:
        status = f"failed (exit {rc})"
    log(f"{name}: {status} in {secs:.1f} s")
    return {"name": name, "cmd": cmd, "rc": rc, "seconds": round(secs, 1), "limit": round(timeout), "status": status,
            "tail": tail}


def _have(module: str, env: dict) -> bool:
    r = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True)
    return r.returncode == 0


def _arch(env: dict) -> Optional[str]:
    """The card's compute capability, e.g. "9.0", from nvidia-smi or torch (in a subprocess, so
    this process never holds a CUDA context)."""
    if shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        cap = r.stdout.strip().splitlines()
        if r.returncode == 0 and cap and re.fullmatch(r"\d+\.\d+", cap[0].strip()):
            return cap[0].strip()
    r = subprocess.run([sys.executable, "-c", "import torch; print('%d.%d' % torch.cuda.get_device_capability())"],
                       env=env, capture_output=True, text=True, timeout=120)
    return r.stdout.strip() or None if r.returncode == 0 else None


def install_wheels(wheels: str, env: dict, timeout: float) -> tuple[dict, Optional[str]]:
    files = sorted(glob.glob(os.path.join(wheels, "*.whl")))
    if not files:
        return {"name": "wheels", "cmd": [], "rc": None, "seconds": 0.0, "limit": None,
                "status": f"failed: no .whl file in {wheels}", "tail": []}, None
    target = tempfile.mkdtemp(prefix="gpu_check_wheels_")
    if _have("pip", env):
        step = run_step("wheels", [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                                   "--target", target, *files], env, timeout)
    else:  # an environment made without pip: a wheel is a zip of what an install puts in place
        t0 = time.monotonic()
        status = "ok (unpacked: no pip here)"
        for f in files:
            try:
                with zipfile.ZipFile(f) as z:
                    z.extractall(target)
            except (OSError, zipfile.BadZipFile) as e:
                status = f"failed: {os.path.basename(f)}: {e}"
        step = {"name": "wheels", "cmd": ["unzip", *files], "rc": None, "limit": None,
                "seconds": round(time.monotonic() - t0, 1), "status": status, "tail": []}
        log(f"wheels: {status}")
    step["wheels"] = [os.path.basename(f) for f in files]
    return step, target


# ------------------------------------------------------------------------------- the facts


def _out(cmd: list[str], timeout: float = 20, env: Optional[dict] = None) -> Optional[str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_facts() -> dict:
    """The commit checked (full sha) and whether the tree differs from it; REASONRL_GIT_COMMIT /
    REASONRL_GIT_DIRTY say them for a copied tree (sent to a GPU machine without, or with a
    stale, .git)."""
    env = os.environ.get("REASONRL_GIT_COMMIT")
    if env:  # said by whoever copied the tree: a copied .git may be older than the files
        return {"commit": env, "dirty": os.environ.get("REASONRL_GIT_DIRTY", "0") in ("1", "true", "yes"),
                "source": "REASONRL_GIT_COMMIT"}
    sha = _out(["git", "rev-parse", "HEAD"])
    if sha:
        dirty = _out(["git", "status", "--porcelain", "--untracked-files=no"])
        return {"commit": sha, "dirty": bool(dirty), "source": "git"}
    return {"commit": None, "dirty": True, "source": "unknown (no .git, no REASONRL_GIT_COMMIT)"}


GPU_QUERY = ("name,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,"
             "power.limit,temperature.gpu,memory.used,memory.total")


def gpu_state() -> Optional[dict]:
    """The card as nvidia-smi reads it now: clocks, power, temperature, memory."""
    if not shutil.which("nvidia-smi"):
        return None
    line = _out(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader"])
    if not line:
        return None
    return dict(zip(GPU_QUERY.split(","), (v.strip() for v in line.splitlines()[0].split(","))))


def toolchain_facts(env: dict) -> dict:
    """Compilers, nvcc and its host compiler, libstdc++ of the compiler and of the process
    (reasonrl_fast/toolchain.py), in a child that imports torch as the build does."""
    code = ("import json, torch; from reasonrl_fast import toolchain; "
            "from torch.utils.cpp_extension import CUDA_HOME; "
            "print(json.dumps(toolchain.describe(cuda_home=CUDA_HOME), default=str))")
    out = _out([sys.executable, "-c", code], timeout=120, env=env)
    try:
        return json.loads(out.splitlines()[-1]) if out else {"error": "reasonrl_fast.toolchain.describe failed"}
    except ValueError:
        return {"error": out[-500:]}


# ------------------------------------------------------------------------------- the steps


def cuda_available(env: dict) -> bool:
    """Whether torch sees a CUDA device, asked in a child: this process holds no CUDA context."""
    return _out([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], timeout=120, env=env) == "True"


SYSTEM_PAIR = ("/usr/bin/gcc", "/usr/bin/g++")


def choose_pair(env: dict) -> tuple[Optional[dict], str]:
    """The CC/CXX for the build: the environment's pair when a test link with it shares the
    process's C++ runtime; else the system pair when that one does (setup.py would refuse the
    environment's: a machine whose CC/CXX name a wrapper that links libstdc++ statically still
    gets its check). Returns (the variables to set, or None to keep the environment's; a line
    that says which and why)."""
    from reasonrl_fast import toolchain

    try:
        cc, cxx = toolchain.compiler_pair(env)
    except toolchain.ToolchainError as e:
        return None, f"compilers: {e}"
    problem = toolchain.private_runtime_problem(toolchain.probe_link(cxx, env=env))
    if problem is None:
        return None, f"compilers: CC={cc} CXX={cxx} (the environment's; a test link shares torch's C++ runtime)"
    sys_cc, sys_cxx = SYSTEM_PAIR
    if os.path.exists(sys_cxx) and os.path.exists(sys_cc) and \
            toolchain.private_runtime_problem(toolchain.probe_link(sys_cxx, env=env)) is None:
        return ({"CC": sys_cc, "CXX": sys_cxx},
                f"compilers: CC={sys_cc} CXX={sys_cxx}, not the environment's CXX={cxx}: {problem}")
    return None, f"compilers: CC={cc} CXX={cxx}, and no system pair to fall back on: {problem}"


def build(env: dict) -> dict:
    benv = dict(env, FORCE_CUDA="1", MAX_JOBS=str(os.cpu_count() or 1))
    pair, why = choose_pair(env)
    log(f"build: {why}")
    benv.update(pair or {})
    benv.setdefault("CUDA_HOME", "/usr/local/cuda")
    arch = _arch(env)
    if arch:
        benv["TORCH_CUDA_ARCH_LIST"] = arch
    ninja = shutil.which("ninja") is not None or _have("ninja", env)
    log(f"build: CUDA_HOME={benv['CUDA_HOME']} TORCH_CUDA_ARCH_LIST={arch} MAX_JOBS={benv['MAX_JOBS']}"
        + ("" if ninja else " (no ninja: the sources compile one after the other)"))
    step = run_step("build", [sys.executable, "setup.py", "build_ext", "--inplace"], benv, step_limit("build"))
    step.update(arch=arch, ninja=ninja, compilers=why)
    if pair:  # the later steps describe the toolchain the build used
        env.update(pair)
    return step


_IMPORT = """
import json, torch
from reasonrl_fast import _C, toolchain
ops = ["token_logprob", "token_logprob_backward", "group_advantage", "tb_loss", "masked_mean"]
has = lambda key: {op: torch._C._dispatch_has_kernel_for_dispatch_key("reasonrl_fast::" + op, key) for op in ops}
facts = toolchain.elf_facts(_C.__file__)
print(json.dumps({"so": _C.__file__, "cpu_kernels": has("CPU"), "cuda_kernels": has("CUDA"), "elf": facts,
                  "problem": toolchain.private_runtime_problem(facts)}, default=str))
"""


def import_check(env: dict) -> dict:
    """Which `_C.so` a fresh interpreter loads, with its ELF facts and kernels per device."""
    step = run_step("import", [sys.executable, "-c", _IMPORT], env, step_limit("import"))
    try:
        info = json.loads(step["tail"][-1]) if step["tail"] else {}
    except ValueError:
        info = {}
    step["info"] = info
    if info:
        if info.get("problem"):
            step["status"] = f"failed: {info['problem']}"
        missing = [op for op, ok in info["cpu_kernels"].items() if not ok]
        step["summary"] = (f"{info['so']}; CUDA kernels: "
                           + ("yes" if all(info["cuda_kernels"].values()) else "no")
                           + (f"; no CPU kernel for {missing}" if missing else ""))
    return step


def errpath(env: dict, out_dir: str) -> dict:
    path = os.path.join(out_dir, "errpath.json")
    limit = step_limit("errpath")
    # one child per device, each held to half the step (a hang is killed and named, not waited out)
    cmd = [sys.executable, "-m", "reasonrl_fast.errpath", "--device", "all", "--timeout",
           str(max(10, int(limit / 2) - 5)), "--json", path]
    step = run_step("errpath", cmd, env, limit)
    try:
        with open(path) as f:
            step["results"] = json.load(f)
    except (OSError, ValueError):
        step["results"] = []
    step["summary"] = "; ".join(f"{r['device']} {r['status']}" + (f" ({r['signal']})" if r.get("signal") else "")
                                for r in step["results"])
    return step


def _junit(path: str) -> dict:
    """Counts and the named failures of a junit XML ({} when there is none)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    out = {"passed": 0, "failed": [], "errors": [], "skipped": 0}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        bad = case.find("failure")
        err = case.find("error")
        if bad is not None or err is not None:
            node = bad if bad is not None else err
            msg = (node.get("message") or (node.text or "").strip().splitlines()[-1:] or [""])
            msg = msg if isinstance(msg, str) else msg[0]
            msg = " ".join(msg.split())
            out["failed" if bad is not None else "errors"].append(f"{name}: {msg[:300]}")
        elif case.find("skipped") is not None:
            out["skipped"] += 1
        else:
            out["passed"] += 1
    return out


FAULTS = r"(Segmentation fault|Aborted|Bus error|Floating[- ]point exception|Illegal instruction)"


def _crashes(log_path: str, start: int) -> list[str]:
    """What the tests' output says beyond the junit XML: the tests whose process died (after
    faulthandler's "Fatal Python error", its fault's name and the test function in the stack
    it printed), the tests faulthandler found still running at its timeout (the test function
    in the stacks it dumped), and crashed xdist workers. Workers write into one stream, so a
    report's lines may be split by other output: the fault's name and the stack are looked for
    on the lines after the marker."""
    try:
        with open(log_path, errors="replace") as f:
            f.seek(start)
            lines = f.read().splitlines()
    except OSError:
        return []
    found, armed, fault = [], None, None
    for line in lines:
        if "Fatal Python error" in line:
            armed, fault = "crash", None
        elif m := re.search(r"Timeout \((\d+:\d+:\d+)\)!|\+{5,} Timeout \+{5,}", line):
            armed, fault = "hang", m.group(1) or "its limit"
        if armed == "crash" and fault is None and (m := re.search(FAULTS, line)):
            fault = m.group(1)
        m = re.search(r'File "([^"]+)", line (\d+) in (test_\w+)', line)
        if armed and m:
            test = f"{os.path.basename(m.group(1))}::{m.group(3)} (line {m.group(2)})"
            found.append(f"{test}: the process died ({fault or 'a fatal error'}); its stack is in gpu_check.log"
                         if armed == "crash" else f"{test}: still running after {fault}; the stacks are in gpu_check.log")
            armed = None
        m = re.search(r"worker '?(gw\d+)'? crashed while running '?([^' ]+?)'?$", line)
        if m:
            found.append(f"{m.group(2)}: its worker {m.group(1)} crashed")
    return list(dict.fromkeys(found))


def run_tests(env: dict, paths: list[str], workers: int, out_dir: str, per_test: int) -> dict:
    junit = os.path.join(out_dir, "junit.xml")
    if os.path.exists(junit):
        os.remove(junit)
    # -v names every test as it ends; -rfE lists failures again in the summary. pytest-timeout's
    # thread method (its signal method never interrupts a hang in native code) dumps the stacks
    # and ends the test's process; faulthandler dumps them a little earlier, whatever the hang.
    cmd = [sys.executable, "-m", "pytest", *paths, "-v", "-rfE", "-p", "no:cacheprovider", f"--junitxml={junit}",
           "-o", f"faulthandler_timeout={max(5, per_test - 5)}"]
    if _have("pytest_timeout", env):
        cmd += ["--timeout", str(per_test), "--timeout-method=thread"]
    if workers > 1 and _have("xdist", env):
        cmd += ["-n", str(workers)]
    start = _LOG.tell() if _LOG else 0
    # The tests take the Triton kernels' first tile candidate: autotuning every test shape
    # would compile and time each candidate again and again (the benchmarks autotune).
    step = run_step("tests", cmd, dict(env, REASONRL_TRITON_AUTOTUNE="0"), step_limit("tests"))
    res = _junit(junit)
    res["crashes"] = _crashes(_LOG.name, start) if _LOG else []
    res["junit"] = os.path.exists(junit)
    step["results"] = res
    line = test_summary(step["tail"])
    if res.get("junit"):
        line = (f"{res['passed']} passed, {len(res['failed'])} failed, {len(res['errors'])} errors, "
                f"{res['skipped']} skipped")
    step["summary"] = line
    if step["status"] == "ok" and (res.get("failed") or res.get("errors") or res["crashes"]):
        step["status"] = "failed"
    return step


def smoke(env: dict) -> dict:
    step = run_step("smoke", [sys.executable, "-u", os.path.join(HERE, "gpu_smoke.py"), "--device", "cuda",
                              "--steps", "2"], env, step_limit("smoke"))
    step["summary"] = next((x for x in reversed(step["tail"]) if x.startswith("gpu_smoke: step")), "")[:200]
    return step


def rl_step(env: dict) -> dict:
    """benchmarks/gpu_step.py on the GPU: one warm-up step and two timed; its last line is its JSON
    result (step["results"]), the summary its line before."""
    cmd = [sys.executable, "-u", os.path.join(HERE, "gpu_step.py"), "--device", "cuda", "--steps", "3"]
    # the fused LM head's Triton kernels take their first tile candidate: autotuning would spend the cap
    step = run_step("rl-step", cmd, dict(env, REASONRL_TRITON_AUTOTUNE="0"), step_limit("rl-step"))
    step["results"] = None
    for line in reversed(step["tail"]):
        if line.startswith("{"):
            try:
                step["results"] = json.loads(line)
            except ValueError:
                pass
            break
    step["summary"] = next((x for x in reversed(step["tail"]) if x.startswith("gpu_step: seq")), "")[:300]
    return step


def rl_step_lines(res: dict) -> list[str]:
    """gpu_check.md's section for the rl-step's result (gpu_step.py's JSON)."""
    pct = lambda x: "-" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    mib = res.get("peak_gpu_mib")
    peer = res.get("peer") or {}
    return ["", "## The whole RL step (rl-step)", "",
            f"{res.get('card')}, {res.get('peak')}; {res.get('prompts_per_step')} prompts x "
            f"{res.get('samples_per_prompt')} samples of {res.get('prompt_len')} + {res.get('response_len')} tokens "
            f"(sequence length {res.get('seq_len')}, {res.get('tokens_per_step')} tokens a step), attention "
            f"{(res.get('layout') or {}).get('attention')}, {res.get('extra_forwards')} extra forward(s); medians of "
            f"{res.get('timed_steps')} step(s)" + (" after a warm-up step" if res.get("warmup_excluded") else
                                                   " (the warm-up included)") + ".", "",
            "| rollout tok/s | update tok/s | step s | peak MiB | MFU update | MFU step | MFU update, with attention |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            f"| {res.get('rollout_tokens_per_s', 0):.0f} | {res.get('update_tokens_per_s', 0):.0f} | "
            f"{res.get('step_s', 0):.2f} | {'-' if mib is None else f'{mib:.0f}'} | {pct(res.get('mfu_update'))} | "
            f"{pct(res.get('mfu_step'))} | {pct(res.get('mfu_update_with_attention'))} |", "",
            f"Peer: {peer.get('source')} {peer.get('model')} at {peer.get('seq_len')} tokens on {peer.get('card')}, "
            f"{peer.get('tokens_per_s', 0):.0f} tok/s, {pct(peer.get('mfu'))} MFU; {res.get('comparable')}."]


def plan_truth(env: dict, out_dir: str, device: str) -> dict:
    """benchmarks/plan_truth.py on `device` (cuda; cpu: its --smoke run), its JSON and table in
    `out_dir`; the summary is its last line (each phase's measured / planned and PASS or FAIL)."""
    paths = {ext: os.path.join(out_dir, f"plan_truth.{ext}") for ext in ("json", "md")}
    for path in paths.values():  # a stale file from an earlier check would pass for this one's
        if os.path.exists(path):
            os.remove(path)
    cmd = [sys.executable, "-u", os.path.join(HERE, "plan_truth.py"), "--device", device, "--json", paths["json"],
           "--md", paths["md"], *(["--smoke"] if device == "cpu" else [])]
    # the fused LM head's Triton kernels take their first tile candidate: autotuning would spend the cap
    step = run_step("plan-truth", cmd, dict(env, REASONRL_TRITON_AUTOTUNE="0"), step_limit("plan-truth"))
    step["summary"] = next((x for x in reversed(step["tail"]) if x.startswith("plan_truth: rollout")), "")[:300]
    try:
        with open(paths["json"]) as f:
            step["results"] = json.load(f)
        with open(paths["md"]) as f:
            step["table"] = f.read()
    except (OSError, ValueError):
        step["results"], step["table"] = None, ""
    return step


def test_summary(tail: list[str]) -> str:
    """pytest's last summary line ("12 passed, 1 skipped in 30.1s"), or the last line."""
    for line in reversed(tail):
        if re.search(r"\d+ (passed|failed|error|errors|skipped)|no tests ran", line):
            return line.strip("= ").strip()
    return tail[-1] if tail else ""


def run_benchmarks(names: list[str], device: str, quick: bool, providers: Optional[str], env: dict,
                   json_path: str, png_dir: Optional[str]) -> list[dict]:
    steps = []
    for name in names:
        cmd = [sys.executable, "-u", os.path.join(HERE, f"bench_{name}.py"), "--device", device, "--json", json_path]
        cmd += ["--png", os.path.join(png_dir, f"{name}.png")] if png_dir else []
        cmd += ["--quick"] if quick else []
        if providers:
            cmd += [f"--providers={providers}"]
        elif quick:  # torch.compile's compiles take most of a quick benchmark's time on a fresh card
            cmd += ["--providers=-compile"]
        # --quick: the first tile candidate, no autotuning (minutes of compiles on a fresh card)
        benv = dict(env, REASONRL_TRITON_AUTOTUNE="0") if quick else env
        steps.append(run_step(f"bench {name}", cmd, benv, step_limit("bench")))
    return steps


# ------------------------------------------------------------------------------- the results


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "machine"


def _facts_lines(info: dict, facts: dict) -> list[str]:
    g, t = facts.get("git") or {}, facts.get("toolchain") or {}
    imp = facts.get("import") or {}
    elf = imp.get("elf") or {}
    lines = [f"- commit: `{g.get('commit') or 'unknown'}`" + (" (dirty: the tree differs from it)" if g.get("dirty") else "")
             + ("" if g.get("source") == "git" else f" (from {g.get('source')})"),
             f"- torch {info.get('torch')} (CUDA {info.get('cuda')}), triton {info.get('triton') or '-'}, "
             f"Python {info.get('python')}, {info.get('cpu_count')} CPU cores"]
    if t.get("error"):
        lines.append(f"- toolchain: not read ({t['error'][:200]})")
    else:
        lines.append(f"- compilers: CC {t.get('cc')} ({t.get('cc_version')}), CXX {t.get('cxx')} ({t.get('cxx_version')})")
        nv = t.get("nvcc") or {}
        if nv:
            lines.append(f"- nvcc: {nv.get('path')} ({nv.get('version')}); its host compiler "
                         f"{nv.get('host_compiler')} ({nv.get('host_compiler_version')})")
        lines.append(f"- libstdc++: the compiler's {t.get('compiler_libstdcxx')}, the process's "
                     f"{t.get('loaded_libstdcxx')}")
    if imp:
        lines.append(f"- `_C.so`: {imp.get('so')}; NEEDED {', '.join(elf.get('needed') or []) or '?'}; "
                     f"defines __cxa_throw: {elf.get('defines_cxa_throw')}; .comment: "
                     f"{'; '.join(elf.get('comment') or []) or '?'}")
        if imp.get("problem"):
            lines.append(f"- **{imp['problem']}**")
    for when in ("gpu_before", "gpu_after"):
        s = facts.get(when)
        if s:
            lines.append(f"- card {'before the benchmarks' if when == 'gpu_before' else 'at the end'}: "
                         + ", ".join(f"{k} {v}" for k, v in s.items()))
    return lines


def report(info: dict, facts: dict, rates: dict, steps: list[dict], rows: list[dict], quick: bool) -> str:
    """The results file's markdown."""
    import harness

    lines = [f"# GPU check: {info.get('card') or info['cpu']} ({info['date_utc']})", "",
             f"- machine: {harness.machine_line(info)}", *_facts_lines(info, facts),
             f"- copy bandwidth (read + write) {rates['copy_gbps']:.1f} GB/s, {rates['matmul_dtype']} "
             f"matmul {rates['matmul_tflops']:.3g} TFLOP/s, measured in this run" if rates else
             "- copy bandwidth and matmul rate: not measured (no benchmark ran)",
             f"- mode: {'quick (one size per benchmark, no autotuning)' if quick else 'full sweep'}", "",
             "## Steps", "", "| step | status | seconds | limit | detail |", "|---|---|---:|---:|---|"]
    for s in steps:
        detail = s.get("summary") or (f"arch {s.get('arch')}, ninja {'yes' if s.get('ninja') else 'no'}; "
                                      f"{s.get('compilers')}" if s["name"] == "build" and s["cmd"] else "")
        if not s["status"].startswith(("ok", "skipped")) and not detail:
            detail = (s["tail"] or [""])[-1][:160]
        limit = "" if s.get("limit") is None else f"{s['limit']}"
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {limit} | {detail.replace('|', '/')} |")
    lines += _problems(steps)
    for s in steps:
        if s["name"] == "rl-step" and isinstance(s.get("results"), dict):
            lines += rl_step_lines(s["results"])
        if s.get("table"):
            res = s.get("results") or {}
            lines += ["", "## The memory planner against this run (plan-truth)", "",
                      f"{res.get('device')}, {res.get('card') or 'no card'}, {res.get('attention')}; "
                      f"measured: {res.get('measure')}. See benchmarks/plan_truth.py for what each side counts.", "",
                      s["table"].rstrip()]
    lines += ["", markdown_tables(rows, rates)]
    return "\n".join(lines) + "\n"


def _problems(steps: list[dict]) -> list[str]:
    """Every failure named: failed and crashed tests, error-path failures, failed steps' last lines."""
    out = []
    for s in steps:
        if s["status"].startswith(("ok", "skipped")):
            continue
        res = s.get("results")
        if s["name"] == "tests" and isinstance(res, dict):
            out += [f"- test failed: `{x}`" for x in res.get("failed", [])]
            out += [f"- test error: `{x}`" for x in res.get("errors", [])]
            out += [f"- {x}" for x in res.get("crashes", [])]
            if not res.get("junit"):
                out.append("- no junit XML: pytest did not finish (see gpu_check.log)")
        elif s["name"] == "errpath" and isinstance(res, list):
            import reasonrl_fast.errpath as ep

            out += ["```", *[ep.summary(r) for r in res if r["status"] not in ("ok", "skipped")], "```"]
        else:
            out += [f"- {s['name']}: {s['status']}", "```", *s["tail"][-15:], "```"]
    return ["", "## What failed", "", *out] if out else []


def markdown_tables(rows: list[dict], rates: dict) -> str:
    """One table per op (the same tables go into RESULTS.md)."""
    import harness

    out = []
    for op in dict.fromkeys(r["op"] for r in rows):
        out += [f"### {op}", "", harness.markdown_table([r for r in rows if r["op"] == op]), ""]
    if not out:
        return "No benchmark rows (see the steps above)."
    return (harness.rates_line(rates) + " Medians of repeated calls after warm-up; peak MB = what "
            "one call allocates above its inputs.\n\n" + "\n".join(out))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where the benchmarks run")
    p.add_argument("--wheels", metavar="DIR", help="install the wheels in DIR first (no network, no deps)")
    p.add_argument("--no-build", action="store_true", help="use the extension as it is")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--tests", default="tests/ops", help="comma-separated test paths (default tests/ops); given "
                   "explicitly, they run also without CUDA")
    p.add_argument("--per-test", type=int, default=60, help="seconds before one test counts as hung")
    p.add_argument("--no-smoke", action="store_true", help="skip the trainer's two-step smoke run")
    p.add_argument("--no-rl-step", action="store_true", help="skip the whole RL step's throughput run")
    p.add_argument("--no-plan-truth", action="store_true", help="skip the memory planner's check against a run")
    p.add_argument("--plan-truth-cpu", action="store_true", help="without CUDA, run the plan-truth step on CPU "
                   "(plan_truth.py --device cpu --smoke) instead of skipping it")
    p.add_argument("--quick", action="store_true", help="one size per benchmark, no Triton autotuning")
    p.add_argument("--benchmarks", default=",".join(BENCHMARKS), help="comma-separated subset ('' for none)")
    p.add_argument("--providers", default=None, help="passed to every benchmark")
    p.add_argument("--out", metavar="DIR", help="the results folder (default benchmarks/gpu_results/<card>-<date>)")
    p.add_argument("--png", action="store_true", help="also a PNG per benchmark in the results folder")
    p.add_argument("--write", metavar="RESULTS.md", help="also put the tables into this file's GPU section")
    p.add_argument("--workers", type=int, default=max(2, min(8, (os.cpu_count() or 2) // 2)),
                   help="pytest-xdist workers for the tests")
    p.add_argument("--budget", type=float, default=480, help="seconds for the whole check: no step runs past it, "
                   "and each leaves the minimum reserved for the steps after it")
    a = p.parse_args(argv)
    names = [b for b in a.benchmarks.split(",") if b]
    unknown = [b for b in names if b not in BENCHMARKS]
    if unknown:
        p.error(f"--benchmarks: unknown {', '.join(unknown)} (known: {', '.join(BENCHMARKS)})")
    if a.wheels and not os.path.isdir(a.wheels):
        p.error(f"--wheels {a.wheels}: not a directory")
    if a.budget <= 0 or a.per_test <= 0:
        p.error("--budget and --per-test must be > 0")
    t_start = time.monotonic()
    global _DEADLINE, _LOG
    _DEADLINE = t_start + a.budget
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(x for x in (ROOT, env.get("PYTHONPATH")) if x)
    import harness

    info = harness.env_info("cpu")  # no CUDA context here; the benchmarks' own lines name the card
    out_dir = a.out or os.path.join(HERE, "gpu_results", f"{_slug(info.get('card') or 'cpu')}-{info['date_utc'][:10]}")
    os.makedirs(out_dir, exist_ok=True)
    _LOG = open(os.path.join(out_dir, "gpu_check.log"), "w")
    explicit_tests = a.tests != "tests/ops"
    _PLAN[:] = ((["wheels"] if a.wheels else [])
                + ["build", "import", "errpath", "tests", "smoke", "rl-step", "plan-truth"]
                + ["bench"] * len(names))
    log(f"budget {a.budget:.0f} s; results in {out_dir}")
    facts: dict = {"git": git_facts()}
    steps: list[dict] = []
    if a.wheels:
        step, target = install_wheels(a.wheels, env, step_limit("wheels"))
        steps.append(step)
        if target and step["status"].startswith("ok"):
            env["PYTHONPATH"] = os.pathsep.join((target, env["PYTHONPATH"]))
    cuda = cuda_available(env)
    log(f"commit {facts['git']['commit']}{' (dirty)' if facts['git']['dirty'] else ''}; CUDA "
        + ("available" if cuda else "not available: the GPU steps are skipped"))
    if a.no_build or not cuda:
        _PLAN.remove("build")
        steps.append(skipped("build", "skipped: --no-build" if a.no_build else NO_CUDA
                             + " (the installed extension is checked)"))
    else:
        steps.append(build(env))
    facts["toolchain"] = toolchain_facts(env)
    steps.append(import_check(env))
    facts["import"] = steps[-1].get("info") or {}
    steps.append(errpath(env, out_dir))
    if a.skip_tests:
        _PLAN.remove("tests")
        steps.append(skipped("tests", "skipped: --skip-tests"))
    elif not cuda and not explicit_tests:
        _PLAN.remove("tests")
        steps.append(skipped("tests", NO_CUDA))
    else:
        steps.append(run_tests(env, a.tests.split(","), a.workers, out_dir, a.per_test))
    if a.no_smoke or not cuda:
        _PLAN.remove("smoke")
        steps.append(skipped("smoke", "skipped: --no-smoke" if a.no_smoke else NO_CUDA))
    else:
        steps.append(smoke(env))
    if a.no_rl_step or not cuda:
        _PLAN.remove("rl-step")
        steps.append(skipped("rl-step", "skipped: --no-rl-step" if a.no_rl_step else NO_CUDA))
    else:
        steps.append(rl_step(env))
    if a.no_plan_truth or not (cuda or a.plan_truth_cpu):
        _PLAN.remove("plan-truth")
        steps.append(skipped("plan-truth", "skipped: --no-plan-truth" if a.no_plan_truth else NO_CUDA))
    else:
        steps.append(plan_truth(env, out_dir, "cuda" if cuda else "cpu"))
    facts["gpu_before"] = gpu_state()
    json_path = os.path.join(tempfile.mkdtemp(prefix="gpu_check_"), "rows.jsonl")  # the rows go into the .json
    if a.device == "cuda" and not cuda:
        for name in names:
            _PLAN.remove("bench")
            steps.append(skipped(f"bench {name}", NO_CUDA))
    else:
        steps += run_benchmarks(names, a.device, a.quick, a.providers, env, json_path,
                                out_dir if a.png else None)
    facts["gpu_after"] = gpu_state()
    envs, rows = harness.read_jsonl(json_path) if os.path.exists(json_path) else ([], [])
    if envs:  # the card, capability and rates as the benchmarks saw them
        info.update({k: v for k, v in envs[0].items() if k in info or k == "capability"})
    rates = {k: envs[0][k] for k in ("copy_gbps", "matmul_tflops", "matmul_dtype")} if envs else {}
    info["total_s"] = round(time.monotonic() - t_start, 1)
    md = report(info, facts, rates, steps, rows, a.quick)
    md += f"\nWhole check: {info['total_s']:.0f} s of a {a.budget:.0f} s budget.\n"
    with open(os.path.join(out_dir, "gpu_check.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
        json.dump({"env": info, "facts": facts, "rates": rates, "per_benchmark_rates": envs, "steps": steps,
                   "rows": rows}, f, indent=1, default=str)
    if a.write:
        body = (f"### GPU ({info['date_utc']}, {harness.machine_line(info)}; commit "
                f"{(facts['git']['commit'] or 'unknown')[:12]}; "
                f"`python benchmarks/gpu_check.py{' --quick' if a.quick else ''}`)\n\n"
                + markdown_tables(rows, rates))
        harness.write_section(a.write, body, "ops-gpu")
    failed = [s["name"] for s in steps if not s["status"].startswith(("ok", "skipped"))]
    log(f"wrote {out_dir}/gpu_check.md and gpu_check.json in {info['total_s']:.0f} s"
        + (f"; failed steps: {', '.join(failed)}" if failed else "; every step that ran is ok"))
    _LOG.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
