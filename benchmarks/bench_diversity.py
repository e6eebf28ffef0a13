"""GRPO against FlowRL on the embedded partition task (data.task=partition: many right answers
per prompt), with the same seeds, budget and warm start: how accurate each policy ends up and
how many different right answers it keeps, first (the warm start) -> last (after RL).

    python benchmarks/bench_diversity.py [--write benchmarks/RESULTS.md] [--seeds 0,1,2]
        [--algos grpo,flowrl] [--n 16] [key=value ...]

For each seed: one training run per algorithm (`python -m reasonrl_fast.train data.task=partition
algo=ALGO trainer.seed=SEED`, extra key=value settings pass through; validation samples 4 per
prompt, so the runs log val/distinct@4), then the eval command at temperature 1 on the held-out
split, `--n` samples per prompt, on the warm start and on each run's last checkpoint. The table
gives the mean over seeds and its standard error (sample std / sqrt(seeds)); with --write it goes
into RESULTS.md and the mean validation curves into benchmarks/partition_diversity.png."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

from checkout import ROOT
from results_md import publish

from reasonrl_fast.util import read_metrics

MARKER = "partition-diversity"
TASK = ["data.task=partition", "rollout.val_n=4", "data.val_size=64"]


def sh(cmd: list[str], what: str) -> float:
    t = time.time()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{what} failed:\n{p.stderr[-3000:]}")
    return time.time() - t


def evaluate(model: str, seed: int, n: int, out: str, extra: list[str]) -> dict:
    ks = sorted({1, 4, n} & set(range(1, n + 1)))
    sh([sys.executable, "-m", "reasonrl_fast.eval", *TASK, *extra, f"model.path={model}", f"trainer.seed={seed}",
        f"eval.n={n}", f"eval.k=[{','.join(map(str, ks))}]", "eval.temperature=1.0", "eval.top_p=1.0",
        f"eval.output_dir={out}"], f"eval of {model}")
    with open(os.path.join(out, "summary.json")) as f:
        overall = json.load(f)["overall"]
    return {k: overall[k] for k in (f"mean@{n}", *[f"pass@{k}" for k in ks], f"distinct@{n}", f"entropy@{n}")}


def warm_start(seed: int, extra: list[str]) -> str:
    """The seed's warm-started model (built once, then cached), outside the runs' wall time."""
    from reasonrl_fast.config import load_config
    from reasonrl_fast.trainer.sft import warm_start as build

    return build(load_config(None, [*TASK, *extra, f"trainer.seed={seed}"]), log=lambda _: None)


def mean_se(values: list[float | None]) -> str:
    """Mean ± standard error over the seeds that have the figure (eval's entropy@n is None where no
    prompt got a right answer), saying how many those are when some lack it."""
    xs = [x for x in values if x is not None]
    if not xs:
        return "-"
    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return f"{m:.3f} ± {se:.3f}" + (f" ({len(xs)} of {len(values)} seeds)" if len(xs) < len(values) else "")


def table(first: dict, last: dict, algos: list[str], seeds: list[int], n: int, walls: dict, extra: list[str]) -> str:
    keys = list(next(iter(first.values())))
    today = datetime.date.today().isoformat()
    lines = [f"### Partition task, {len(seeds)} seeds ({today}, {os.cpu_count()}-core CPU; "
             f"`python benchmarks/bench_diversity.py{' ' + ' '.join(extra) if extra else ''}`)", "",
             f"Eval on the held-out split at temperature 1, {n} samples per prompt; mean ± standard error over "
             f"seeds {', '.join(map(str, seeds))}; first = the warm start (the same for both), last = after RL.", "",
             "| algo | " + " | ".join(keys) + " | wall per run (s) |",
             "|---|" + "---|" * len(keys) + "---:|"]
    lines.append("| warm start | " + " | ".join(mean_se([first[s][k] for s in seeds]) for k in keys) + " | - |")
    for a in algos:
        lines.append(f"| {a} | " + " | ".join(mean_se([last[a, s][k] for s in seeds]) for k in keys)
                     + f" | {statistics.fmean(walls[a]):.0f} |")
    return "\n".join(lines)


def curves(runs: dict, algos: list[str], seeds: list[int], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key in zip(axes, ("val/accuracy", "val/pass@4", "val/distinct@4")):
        for a in algos:
            rows = [[r for r in read_metrics(runs[a, s]) if key in r] for s in seeds]
            steps = [r["step"] for r in rows[0]]
            ax.plot(steps, [statistics.fmean(rs[i][key] for rs in rows) for i in range(len(steps))], label=a)
        ax.set_title(key + f" (mean of {len(seeds)} seeds)")
        ax.set_xlabel("step")
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", metavar="RESULTS.md")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--algos", default="grpo,flowrl")
    p.add_argument("--n", type=int, default=16)
    a, extra = p.parse_known_args()
    seeds, algos = [int(s) for s in a.seeds.split(",")], a.algos.split(",")
    first, last, runs, walls = {}, {}, {}, {a_: [] for a_ in algos}
    with tempfile.TemporaryDirectory() as tmp:
        for s in seeds:
            first_model = warm_start(s, extra)
            for algo in algos:
                out = runs[algo, s] = os.path.join(tmp, f"{algo}-{s}")
                wall = sh([sys.executable, "-m", "reasonrl_fast.train", *TASK, f"algo={algo}", f"trainer.seed={s}",
                           "trainer.save_last=true", "trainer.progress=false", f"trainer.output_dir={out}", *extra],
                          f"{algo} seed {s}")
                walls[algo].append(wall)
                ckpt = max((d for d in os.listdir(out) if d.startswith("checkpoint-")), key=lambda d: int(d[11:]))
                last[algo, s] = evaluate(os.path.join(out, ckpt), s, a.n, os.path.join(tmp, f"eval-{algo}-{s}"), extra)
                print(json.dumps({"algo": algo, "seed": s, "wall_s": round(wall), **last[algo, s]}), flush=True)
            first[s] = evaluate(first_model, s, a.n, os.path.join(tmp, f"eval-first-{s}"), extra)
            print(json.dumps({"algo": "warm start", "seed": s, **first[s]}), flush=True)
        if a.write:
            png = os.path.join(os.path.dirname(os.path.abspath(a.write)), "partition_diversity.png")
            curves(runs, algos, seeds, png)
            print(f"wrote {png}")
    body = table(first, last, algos, seeds, a.n, walls, extra)
    publish(body, a.write, MARKER)

if __name__ == "__main__":
    main()
