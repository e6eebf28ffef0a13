"""The check of a GPU machine (`make gpu-check`): build the CUDA kernels, run the op tests, run
the GPU benchmarks, and write one results file. Every step is timed and logged; a failed step is
recorded and the next one still runs.

    python benchmarks/gpu_check.py                       # full sweep, stopped at 5 minutes (--budget)
    python benchmarks/gpu_check.py --quick               # tests + one size per benchmark
    python benchmarks/gpu_check.py --wheels DIR          # first install the wheels in DIR (no network)
    python benchmarks/gpu_check.py --write benchmarks/RESULTS.md   # also the "GPU" section there
    python benchmarks/gpu_check.py --device cpu --no-build --skip-tests --quick   # a dry run on CPU

Steps:
  a. wheels (--wheels DIR): `pip install --no-index --no-deps --target TMP DIR/*.whl`
     (liger-kernel, cut-cross-entropy, flash-attn where a wheel exists, expecttest), TMP put on
     the PYTHONPATH of every later step;
  b. build (not with --no-build): `setup.py build_ext --inplace` with FORCE_CUDA=1, CUDA_HOME
     (default /usr/local/cuda), MAX_JOBS = all cores and TORCH_CUDA_ARCH_LIST = the card's
     compute capability only;
  c. tests (not with --skip-tests): `pytest tests/ops` (CUDA kernels and compiled Triton), in
     parallel with pytest-xdist where installed;
  d. benchmarks: each per-op script with --device DEVICE (and --quick), rows to JSON lines;
  e. results: OUT.md and OUT.json (default benchmarks/gpu_results/<card>-<date>): the machine,
     the copy bandwidth and matmul rate measured in the run, per op the table, the test summary
     and the build time.
Each step has its own time limit, so one hang cannot take the whole budget.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

BENCHMARKS = ["token_logprob", "linear_token_logprob", "group_advantage", "tb_loss", "masked_mean"]


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


_DEADLINE = float("inf")  # the whole check's end (--budget): no step runs past it


def run_step(name: str, cmd: list[str], env: dict, timeout: float, cwd: str = ROOT) -> dict:
    """Run cmd, echoing its output as it comes; kill its process group past `timeout` seconds
    (or the check's deadline, whichever comes first). Returns {name, cmd, rc, seconds, status, tail}."""
    left = _DEADLINE - time.monotonic()
    if left < 5:
        log(f"{name}: skipped, the check's budget is spent")
        return {"name": name, "cmd": cmd, "rc": None, "seconds": 0.0, "status": "skipped: budget spent", "tail": []}
    timeout = min(timeout, left)
    log(f"{name}: {' '.join(cmd)} (limit {timeout:.0f} s)")
    t0 = time.monotonic()
    tail: list[str] = []
    status = "ok"
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except OSError as e:
        return {"name": name, "cmd": cmd, "rc": None, "seconds": 0.0, "status": f"failed to start: {e}", "tail": []}
    deadline = t0 + timeout
    fd, pending = proc.stdout.fileno(), b""
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.killpg(proc.pid, signal.SIGKILL)
            status = f"timed out after {timeout:.0f} s"
            break
        if not sel.select(timeout=min(left, 1.0)):
            if proc.poll() is not None:  # exited; a leftover grandchild may hold the pipe open
                break
            continue
        chunk = os.read(fd, 65536)  # never blocks on a line left unfinished by a hung child
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace").rstrip()
            print(f"  | {line}", flush=True)
            tail = (tail + [line])[-40:]
    if pending.strip():
        tail = (tail + [pending.decode(errors="replace").rstrip()])[-40:]
    rc = proc.wait()
    sel.close()
    proc.stdout.close()
    secs = time.monotonic() - t0
    if status == "ok" and rc != 0:
        status = f"failed (exit {rc})"
    log(f"{name}: {status} in {secs:.1f} s")
    return {"name": name, "cmd": cmd, "rc": rc, "seconds": round(secs, 1), "status": status, "tail": tail}


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
        return {"name": "wheels", "cmd": [], "rc": None, "seconds": 0.0,
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
        step = {"name": "wheels", "cmd": ["unzip", *files], "rc": None,
                "seconds": round(time.monotonic() - t0, 1), "status": status, "tail": []}
        log(f"wheels: {status}")
    step["wheels"] = [os.path.basename(f) for f in files]
    return step, target


def build(env: dict, timeout: float) -> dict:
    benv = dict(env, FORCE_CUDA="1", MAX_JOBS=str(os.cpu_count() or 1))
    benv.setdefault("CUDA_HOME", "/usr/local/cuda")
    arch = _arch(env)
    if arch:
        benv["TORCH_CUDA_ARCH_LIST"] = arch
    ninja = shutil.which("ninja") is not None or _have("ninja", env)
    log(f"build: CUDA_HOME={benv['CUDA_HOME']} TORCH_CUDA_ARCH_LIST={arch} MAX_JOBS={benv['MAX_JOBS']}"
        + ("" if ninja else " (no ninja: the sources compile one after the other)"))
    step = run_step("build", [sys.executable, "setup.py", "build_ext", "--inplace"], benv, timeout)
    step.update(arch=arch, ninja=ninja)
    return step


def test_summary(tail: list[str]) -> str:
    """pytest's last summary line ("12 passed, 1 skipped in 30.1s"), or the last line."""
    for line in reversed(tail):
        if re.search(r"\d+ (passed|failed|error|errors|skipped)|no tests ran", line):
            return line.strip("= ").strip()
    return tail[-1] if tail else ""


def run_tests(env: dict, timeout: float, workers: int) -> dict:
    # -rfE names every failure in the summary. A per-test limit of 30 s: on the H200 machine a
    # test that expects an error from the extension once hung, and it must not take the budget.
    cmd = [sys.executable, "-m", "pytest", "tests/ops", "-q", "-rfE", "-p", "no:cacheprovider"]
    if workers > 1 and _have("xdist", env):
        cmd += ["-n", str(workers)]
    if _have("pytest_timeout", env):
        cmd += ["--timeout", "30"]
    # The tests take the Triton kernels' first tile candidate: autotuning every test shape
    # would compile and time each candidate again and again (the benchmarks autotune).
    step = run_step("tests", cmd, dict(env, REASONRL_TRITON_AUTOTUNE="0"), timeout)
    step["summary"] = test_summary(step["tail"])
    return step


def run_benchmarks(names: list[str], device: str, quick: bool, providers: Optional[str], env: dict,
                   timeout: float, json_path: str, png_dir: str) -> list[dict]:
    steps = []
    for name in names:
        cmd = [sys.executable, "-u", os.path.join(HERE, f"bench_{name}.py"), "--device", device,
               "--json", json_path, "--png", os.path.join(png_dir, f"{name}.png")]
        cmd += ["--quick"] if quick else []
        cmd += ["--providers", providers] if providers else []
        steps.append(run_step(f"bench {name}", cmd, env, timeout))
    return steps


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "machine"


def report(info: dict, rates: dict, steps: list[dict], rows: list[dict], quick: bool) -> str:
    """The results file's markdown."""
    import harness

    lines = [f"# GPU check: {info.get('card') or info['cpu']} ({info['date_utc']})", "",
             f"- machine: {harness.machine_line(info)}; Python {info['python']}, {info['cpu_count']} CPU cores",
             f"- copy bandwidth (read + write) {rates['copy_gbps']:.1f} GB/s, {rates['matmul_dtype']} "
             f"matmul {rates['matmul_tflops']:.3g} TFLOP/s, measured in this run" if rates else
             "- copy bandwidth and matmul rate: not measured (no benchmark ran)",
             f"- mode: {'quick (one size per benchmark)' if quick else 'full sweep'}", "", "## Steps", "",
             "| step | status | seconds | detail |", "|---|---|---:|---|"]
    for s in steps:
        detail = s.get("summary") or (f"arch {s.get('arch')}, ninja {'yes' if s.get('ninja') else 'no'}"
                                      if s["name"] == "build" else "")
        if not s["status"].startswith("ok") and not detail:
            detail = (s["tail"] or [""])[-1][:120]
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {detail.replace('|', '/')} |")
    lines += ["", markdown_tables(rows, rates)]
    return "\n".join(lines) + "\n"


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
    p.add_argument("--device", default="cuda")
    p.add_argument("--wheels", metavar="DIR", help="install the wheels in DIR first (no network, no deps)")
    p.add_argument("--no-build", action="store_true", help="use the extension as it is")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--quick", action="store_true", help="one size per benchmark")
    p.add_argument("--benchmarks", default=",".join(BENCHMARKS), help="comma-separated subset")
    p.add_argument("--providers", default=None, help="passed to every benchmark")
    p.add_argument("--out", metavar="PREFIX", help="writes PREFIX.md and PREFIX.json "
                   "(default benchmarks/gpu_results/<card>-<date>)")
    p.add_argument("--write", metavar="RESULTS.md", help="also put the tables into this file's GPU section")
    p.add_argument("--workers", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                   help="pytest-xdist workers for the tests")
    p.add_argument("--budget", type=float, default=300, help="seconds for the whole check: no step "
                   "runs past it (a step left without time is recorded as skipped)")
    p.add_argument("--build-timeout", type=float, default=240)
    p.add_argument("--test-timeout", type=float, default=150)
    p.add_argument("--bench-timeout", type=float, default=None, help="per benchmark (default 90 s quick, 150 s full)")
    a = p.parse_args(argv)
    unknown = [b for b in a.benchmarks.split(",") if b not in BENCHMARKS]
    if unknown:
        p.error(f"--benchmarks: unknown {', '.join(unknown)} (known: {', '.join(BENCHMARKS)})")
    if a.wheels and not os.path.isdir(a.wheels):
        p.error(f"--wheels {a.wheels}: not a directory")
    t_start = time.monotonic()
    global _DEADLINE
    _DEADLINE = t_start + a.budget
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(x for x in (ROOT, env.get("PYTHONPATH")) if x)
    steps: list[dict] = []
    if a.wheels:
        step, target = install_wheels(a.wheels, env, 120)
        steps.append(step)
        if target and step["status"].startswith("ok"):
            env["PYTHONPATH"] = os.pathsep.join((target, env["PYTHONPATH"]))
    if not a.no_build:
        steps.append(build(env, a.build_timeout))
    if not a.skip_tests:
        steps.append(run_tests(env, a.test_timeout, a.workers))
    work = tempfile.mkdtemp(prefix="gpu_check_")
    json_path = os.path.join(work, "rows.jsonl")
    import harness

    info = harness.env_info("cpu")  # no CUDA context here; the benchmarks' own lines name the card
    out = a.out or os.path.join(HERE, "gpu_results", f"{_slug(info.get('card') or 'cpu')}-{info['date_utc'][:10]}")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    png_dir = out + "-png"
    os.makedirs(png_dir, exist_ok=True)
    timeout = a.bench_timeout or (90 if a.quick else 150)
    steps += run_benchmarks(a.benchmarks.split(","), a.device, a.quick, a.providers, env, timeout, json_path, png_dir)
    envs, rows = harness.read_jsonl(json_path) if os.path.exists(json_path) else ([], [])
    if envs:  # the card, capability and rates as the benchmarks saw them
        info.update({k: v for k, v in envs[0].items() if k in info or k == "capability"})
    rates = {k: envs[0][k] for k in ("copy_gbps", "matmul_tflops", "matmul_dtype")} if envs else {}
    info["total_s"] = round(time.monotonic() - t_start, 1)
    md = report(info, rates, steps, rows, a.quick)
    md += f"\nWhole check: {info['total_s']:.0f} s.\n"
    with open(out + ".md", "w") as f:
        f.write(md)
    with open(out + ".json", "w") as f:
        json.dump({"env": info, "rates": rates, "per_benchmark_rates": envs, "steps": steps, "rows": rows},
                  f, indent=1)
    if a.write:
        body = (f"### GPU ({info['date_utc']}, {harness.machine_line(info)}; "
                f"`python benchmarks/gpu_check.py{' --quick' if a.quick else ''}`)\n\n"
                + markdown_tables(rows, rates))
        harness.write_section(a.write, body, "ops-gpu")
    failed = [s["name"] for s in steps if not s["status"].startswith("ok")]
    log(f"wrote {out}.md and {out}.json in {info['total_s']:.0f} s"
        + (f"; failed steps: {', '.join(failed)}" if failed else "; every step ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
