"""GRPO, FlowRL and FAPO on the embedded default, one after the other with the same seed and
budget: validation accuracy and flawed-positive ratio before and after, wall time, step time,
and for FAPO what the GenRM (the rule server the run starts) costs per step.

    python benchmarks/bench_algos.py [--write benchmarks/RESULTS.md] [--algos grpo,flowrl,fapo] [key=value ...]

With --write, the table goes into RESULTS.md and the runs' curves (reasonrl_fast.plot) into
benchmarks/embedded_algos.png beside it.

Each run is `python -m reasonrl_fast.train algo=ALGO` (extra key=value settings pass through)
in a temporary run directory; the warm start is cached, so only the first run pays for it and
it is timed apart from the RL steps."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from checkout import ROOT
from results_md import publish

from reasonrl_fast.util import read_metrics

MARKER = "embedded-algos"


def run(algo: str, extra: list[str], tmp: str) -> dict:
    out = os.path.join(tmp, algo)
    cmd = [sys.executable, "-m", "reasonrl_fast.train", f"algo={algo}", f"trainer.output_dir={out}",
           "trainer.progress=false", *extra]
    t = time.time()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - t
    if p.returncode:
        sys.exit(f"{algo} failed:\n{p.stderr[-3000:]}")
    rows = read_metrics(out)
    vals = [r for r in rows if "val/accuracy" in r]
    steps = [r for r in rows if "time/step_s" in r][1:]  # the first step warms up
    med = lambda k: statistics.median(r[k] for r in steps) if k in steps[0] else float("nan")  # noqa: E731
    mean = lambda k: statistics.fmean(r[k] for r in steps) if k in steps[0] else float("nan")  # noqa: E731
    return {"algo": algo, "wall_s": wall, "steps": len(steps) + 1,
            "acc0": vals[0]["val/accuracy"], "acc1": vals[-1]["val/accuracy"],
            "fp0": vals[0].get("val/flawed_positive_ratio", float("nan")),
            "fp1": vals[-1].get("val/flawed_positive_ratio", float("nan")),
            "step_s": med("time/step_s"), "genrm_s": mean("time/genrm_s"), "wait_s": mean("time/genrm_wait_s"),
            "share": mean("time/genrm_s") / mean("time/step_s"), "wait_share": mean("time/genrm_wait_s") / mean("time/step_s"),
            "failures": sum(r.get("genrm/failures", 0) for r in steps)}


def table(rows: list[dict], extra: list[str], load: str) -> str:
    today = datetime.date.today().isoformat()
    lines = [f"### Embedded default, one seed per algorithm ({today}, {os.cpu_count()}-core CPU, load {load}; "
             f"`python benchmarks/bench_algos.py{' ' + ' '.join(extra) if extra else ''}`)", "",
             "| algo | val accuracy | val flawed-positive ratio | wall (s) | median step (s) | GenRM span / step | GenRM wait / step | GenRM failures |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        g = r["algo"] == "fapo"
        lines.append(f"| {r['algo']} | {r['acc0']:.3f} -> {r['acc1']:.3f} | {r['fp0']:.3f} -> {r['fp1']:.3f} | "
                     f"{r['wall_s']:.0f} | {r['step_s']:.3f} | "
                     + (f"{100 * r['share']:.1f} % | {100 * r['wait_share']:.1f} % | {r['failures']} |" if g else "- | - | - |"))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", metavar="RESULTS.md")
    p.add_argument("--algos", default="grpo,flowrl,fapo")
    a, extra = p.parse_known_args()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for algo in a.algos.split(","):
            rows.append(run(algo, extra, tmp))
            print(json.dumps(rows[-1]), flush=True)
        if a.write:  # the runs' curves side by side, beside the table
            from reasonrl_fast.plot import plot

            png = os.path.join(os.path.dirname(os.path.abspath(a.write)), "embedded_algos.png")
            plot([os.path.join(tmp, algo) for algo in a.algos.split(",")], png)
            print(f"wrote {png}")
    body = table(rows, extra, f"{load0:.1f} at the start and {os.getloadavg()[0]:.1f} at the end")
    publish(body, a.write, MARKER)

if __name__ == "__main__":
    main()
