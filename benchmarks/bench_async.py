"""Generation beside training: the synchronous colocated step against split placement (one rollout
worker beside one trainer worker) at trainer.max_staleness 1 and 2, on the embedded default, the
same seeds and number of samples, one run after another on this machine.

    python benchmarks/bench_async.py [--write benchmarks/RESULTS.md] [--seeds 0,1,2]
        [--algos grpo,flowrl] [--latency 0,0.01] [--genrm-latency 0.1] [--staleness 1,2]
        [--sync-workers 1,2,1x2] [--trainer-threads 2] [--python PY] [key=value ...]

Each `--latency` is a case: 0 is the embedded default as it is; a latency L > 0 scores every sample
through benchmarks/latency_reward.py, which sleeps L seconds first (a wait that uses none of the
trainer's cores, as a remote reward service's), so that a step's reward time is about
samples x L / reward.num_workers. FAPO's runs (`--algos fapo`) ask a GenRM server the benchmark
starts, benchmarks/latency_genrm.py: the rule judge answering each request `--genrm-latency`
seconds late (0: at once), a remote GenRM's wait. Synchronous means colocated placement at each
`--sync-workers` count (workers_per_node, each of one thread or, as 1x2, of two); the faster of
them (by mean wall time over the seeds) is the baseline each split run's ratio is taken against.
`--trainer-threads` gives the split trainer worker that many threads beside its rollout worker's
one (rollout.cpus_per_worker=1): on shared cores, where the rollout worker mostly waits, the
update can take them.

The table gives, per case, algorithm and layout, the means over the seeds of: wall time of the
run (the warm start built before, not counted), its ratio to the synchronous baseline, the last
validation accuracy and its difference from the baseline's, the staleness of the tokens trained
and the share of responses an update landed in the middle of (rollout/partial_frac), each role's busy fraction (split: 1 - its idle time over the steps' time, the idle
times the trainer logs as time/trainer_idle_s and time/rollout_idle_s), and the synchronous
steps' rollout and reward seconds (what the split run can overlap). Extra key=value settings
pass to every run (a smoke run: trainer.steps=2 and small sizes); `--python` runs the trainer
with another interpreter (the vLLM venv's, with rollout.backend=vllm)."""

from __future__ import annotations

import argparse
import datetime
import json
import contextlib
import os
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time

from checkout import HERE, ROOT, child_env
from results_md import publish

from reasonrl_fast.util import read_metrics

MARKER = "async-split"
REWARD = os.path.join(HERE, "latency_reward.py") + ":scored_after_a_wait"
GENRM = os.path.join(HERE, "latency_genrm.py")


def layouts(staleness: list[int], sync: list[str], trainer_threads: int) -> dict[str, list[str]]:
    """Each layout's settings, by its name in the table. `sync`: "W" (W workers of one thread) or
    "WxT" (of T threads each); `trainer_threads`: the split trainer worker's (its rollout worker
    has one)."""
    out = {}
    for spec in sync:
        w, _, t = spec.partition("x")
        name = f"sync, {w} worker(s)" + (f" x {t} threads" if t else "")
        out[name] = ["trainer.placement=colocated", f"trainer.workers_per_node={w}",
                     f"trainer.cpus_per_worker={t or 1}"]
    threads = f", trainer {trainer_threads} threads" if trainer_threads > 1 else ""
    for k in staleness:
        out[f"split, staleness {k}{threads}"] = [
            "trainer.placement=split", "rollout.workers=1", "trainer.workers_per_node=1", f"trainer.max_staleness={k}",
            f"trainer.cpus_per_worker={trainer_threads}", "rollout.cpus_per_worker=1"]
    return out


def run(python: str, settings: list[str], latency: float, out: str) -> dict:
    """One training run; its wall time and what the table reads from its metrics."""
    extra = [f"data.reward_fn={REWARD}"] if latency else []
    cmd = [python, "-m", "reasonrl_fast.train", *settings, *extra, f"trainer.output_dir={out}",
           "trainer.progress=false"]
    t = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=child_env(REASONRL_REWARD_LATENCY_S=str(latency)),
                       capture_output=True, text=True)
    wall = time.time() - t
    if p.returncode:
        sys.exit(f"run failed ({' '.join(settings)}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    rows = read_metrics(out)
    steps = [r for r in rows if "time/step_s" in r]
    vals = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
    total = sum(r["time/step_s"] for r in steps)
    busy = lambda key: 1 - sum(r.get(key, 0.0) for r in steps) / total if total else float("nan")  # noqa: E731
    mean = lambda key: statistics.fmean(r[key] for r in steps if key in r) if any(key in r for r in steps) else float("nan")  # noqa: E731
    return {"wall_s": wall, "val": vals[-1] if vals else float("nan"), "staleness": mean("rollout/staleness_mean"),
            "partial": mean("rollout/partial_frac"),
            "trainer_busy": busy("time/trainer_idle_s"), "rollout_busy": busy("time/rollout_idle_s"),
            "rollout_s": mean("time/rollout_s"), "reward_s": mean("time/reward_s"),
            "genrm_wait_s": mean("time/genrm_wait_s"), "steps": len(steps)}


@contextlib.contextmanager
def late_genrm(python: str, latency: float, log: str, start_timeout_s: float = 60.0):
    """A GenRM server answering `latency` seconds late (latency_genrm.py) on a free loopback port,
    for the runs inside the block; the setting that points FAPO at it."""
    with open(log, "wb") as err:
        proc = subprocess.Popen([python, GENRM, "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
                                env=child_env(REASONRL_GENRM_LATENCY_S=str(latency)))
    try:
        buf, deadline = b"", time.monotonic() + start_timeout_s
        while not (m := re.search(rb"listening on (http://\S+/v1)", buf)):
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                sys.exit(f"the GenRM server did not start; its log {log} ends with:\n{open(log).read()[-2000:]}")
            if select.select([proc.stdout], [], [], min(left, 0.5))[0]:
                buf += os.read(proc.stdout.fileno(), 4096)
        yield f"fapo.genrm.addresses=[{m.group(1).decode()}]"
    finally:
        proc.terminate()
        proc.wait(10)


def warm_starts(python: str, extra: list[str], seeds: list[int]) -> None:
    """Each seed's warm start built (and cached) before anything is timed."""
    code = ("import sys; from reasonrl_fast.config import load_config; from reasonrl_fast.trainer.sft import warm_start; "
            "warm_start(load_config(None, sys.argv[1:]), log=lambda _: None)")
    for seed in seeds:
        subprocess.run([python, "-c", code, *extra, f"trainer.seed={seed}"], cwd=ROOT, env=child_env(), check=True)


def table(results: dict, names: list[str], seeds: list[int], args: str, load: str, genrm: float) -> str:
    today = datetime.date.today().isoformat()
    lines = [f"### Split placement against the synchronous step, embedded default ({today}, {os.cpu_count()}-core CPU, "
             f"load {load}; means over seeds {','.join(map(str, seeds))}; `python benchmarks/bench_async.py{args}`)", "",
             "| reward latency (s) | GenRM latency (s) | algo | layout | wall (s) | vs sync | last val accuracy | vs sync (points) "
             "| staleness | partial | trainer busy | rollout busy | rollout s/step | reward s/step | GenRM wait s/step |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (latency, algo), by_layout in results.items():
        m = {name: {k: statistics.fmean(r[k] for r in runs) for k in runs[0]} for name, runs in by_layout.items()}
        sync = min((n for n in names if n.startswith("sync")), key=lambda n: m[n]["wall_s"])
        for name in names:
            r, s = m[name], m[sync]
            split = name.startswith("split")
            own = (f"{r['staleness']:.2f} | {r['partial']:.2f} | {r['trainer_busy']:.2f} | {r['rollout_busy']:.2f} "
                   f"| - | - | -" if split else
                   f"0 | - | - | - | {r['rollout_s']:.2f} | {r['reward_s']:.2f} | "
                   + (f"{r['genrm_wait_s']:.2f}" if algo == "fapo" else "-"))
            lines.append(f"| {latency:g} | {f'{genrm:g}' if algo == 'fapo' else '-'} | {algo} | "
                         f"{name}{' (baseline)' if name == sync else ''} | {r['wall_s']:.0f} | "
                         f"{r['wall_s'] / s['wall_s']:.2f}x | {r['val']:.3f} | {100 * (r['val'] - s['val']):+.1f} | {own} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", metavar="RESULTS.md")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--algos", default="grpo,flowrl")
    p.add_argument("--latency", default="0,0.01", help="seconds each reward call waits, one case each")
    p.add_argument("--genrm-latency", type=float, default=0.0, help="seconds each GenRM request waits (fapo)")
    p.add_argument("--staleness", default="1,2")
    p.add_argument("--sync-workers", default="1,2", help="W or WxT (W workers of T threads), comma-separated")
    p.add_argument("--trainer-threads", type=int, default=1, help="the split trainer worker's threads")
    p.add_argument("--python", default=sys.executable)
    a, extra = p.parse_known_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    lay = layouts([int(k) for k in a.staleness.split(",")], a.sync_workers.split(","), a.trainer_threads)
    load0 = os.getloadavg()[0]
    warm_starts(a.python, extra, seeds)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        genrm = (stack.enter_context(late_genrm(a.python, a.genrm_latency, os.path.join(tmp, "genrm.log")))
                 if "fapo" in a.algos.split(",") else None)
        for latency in (float(x) for x in a.latency.split(",")):
            for algo in a.algos.split(","):
                for name, settings in lay.items():
                    for seed in seeds:
                        out = os.path.join(tmp, f"{latency}-{algo}-{name}-{seed}".replace(" ", "").replace(",", "-"))
                        # the layout's settings last: they are what is compared
                        judge = [genrm] if algo == "fapo" else []
                        r = run(a.python, [*extra, f"algo={algo}", *judge, f"trainer.seed={seed}", *settings], latency,
                                out)
                        results.setdefault((latency, algo), {}).setdefault(name, []).append(r)
                        print(json.dumps({"latency": latency, "algo": algo, "layout": name, "seed": seed, **r}), flush=True)
    shown = "".join(f" {x}" for x in sys.argv[1:] if not x.startswith("--write") and x != a.write)
    body = table(results, list(lay), seeds, shown, f"{load0:.1f} at the start and {os.getloadavg()[0]:.1f} at the end",
                 a.genrm_latency)
    publish(body, a.write, MARKER)


if __name__ == "__main__":
    main()
