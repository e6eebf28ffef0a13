"""Does FlowRL match its target distribution over right answers where GRPO drifts? GRPO and FlowRL
(at several β) on the embedded partition task (data.task=partition: many right answers per
prompt), from a narrow and a flat warm start, with the same seeds and budget.

    python benchmarks/bench_diversity.py [--write benchmarks/RESULTS.md] [--seeds 0,1,2,3,4]
        [--algos grpo,flowrl:1,flowrl:5,flowrl:15] [--warm narrow,flat] [--n 64] [--jobs 2]
        [--out DIR] [--trace K] [key=value ...]

FlowRL's target is p*(y|x) ∝ π_ref(y|x) exp(β r̂(x, y)); with 0/1 rewards every right answer of a
prompt has the same r̂, so over right answers the target is the reference's (the warm start's)
own distribution, renormalised. For each seed and warm start (`narrow`: the task's default mix
of splitting styles; `flat`: data.partition.styles=[1,1,1]) the script builds the warm start,
evaluates it twice with independent samples (the second against the first: the metric's sampling
floor), trains each algorithm (`python -m reasonrl_fast.train data.task=partition algo=... `; an
algo `flowrl:B` sets flowrl.beta=B; extra key=value settings pass through) and evaluates its last
checkpoint with eval.target = the warm start's first eval: tv@n and kl@n are the distance of the
policy's right answers from the target's (docs/eval.md §Distance to a target), beside accuracy,
pass@k, distinct@n and entropy@n, at temperature 1 with `--n` samples per held-out prompt.

Each finished piece is kept as JSON under --out, with the settings it was made with, so a rerun
with the same --out and settings picks up where the last stopped (a piece kept from other
settings is refused, naming it, rather than reused). `--jobs` pieces run at once (a run's startup mostly waits, so 2 on 2 cores keep
them busy). `--trace K` also saves every K steps and evaluates every checkpoint: the distance over
training, in a section and figure of its own (partition_diversity_trace.png). The table gives mean ± standard error over seeds (sample std / sqrt(seeds)); with
--write it goes into RESULTS.md, the figure into benchmarks/partition_diversity.png."""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from checkout import ROOT, child_env
from results_md import publish

MARKER = "partition-diversity"
TASK = ["data.task=partition", "rollout.val_n=4", "data.val_size=64"]
WARM = {"narrow": [], "flat": ["data.partition.styles=[1,1,1]"]}
"""The warm starts: the task's default mix of splitting styles (0.6/0.3/0.1), and an even one."""
STEPS = "trainer.steps=300"
"""Twice the embedded default's: the distributions still move at 150 (a key=value overrides it)."""


def sh(cmd: list[str], what: str) -> tuple[float, str]:
    t = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"{what} failed:\n{p.stderr[-3000:]}")
    return time.time() - t, p.stdout


def algo_args(spec: str) -> list[str]:
    """'grpo' -> [algo=grpo]; 'flowrl:5' -> [algo=flowrl, flowrl.beta=5]."""
    algo, _, beta = spec.partition(":")
    return [f"algo={algo}", *([f"flowrl.beta={beta}"] if beta else [])]


def label(spec: str) -> str:
    algo, _, beta = spec.partition(":")
    return f"{algo} β={beta}" if beta else algo


class StalePiece(RuntimeError):
    """A piece under --out made with other settings than this sweep's."""


class Sweep:
    def __init__(self, out: str, n: int, extra: list[str], trace: int):
        self.out, self.n, self.extra, self.trace = out, n, extra, trace
        for d in ("results", "eval", "runs"):
            os.makedirs(os.path.join(out, d), exist_ok=True)

    def kept(self, name: str, settings: dict) -> dict | None:
        """The piece kept under --out (None: not made yet). One kept from other settings (another
        --n, key=value, --trace, or from before pieces recorded theirs) is refused: reused, it
        would put other runs' figures into the table."""
        path = os.path.join(self.out, "results", f"{name}.json")
        if not os.path.exists(path):
            return None
        try:
            with open(path) as f:
                res = json.load(f)
        except (OSError, ValueError) as e:  # cut off by a crash mid-write of an older version, say
            raise StalePiece(f"{path} cannot be read ({e}): delete the piece to make it again") from None
        if not isinstance(res, dict):
            raise StalePiece(f"{path} is not a piece of this script (a JSON {type(res).__name__}): delete it to "
                             f"make it again")
        made_with = res.pop("settings", None)
        if made_with != json.loads(json.dumps(settings)):  # compared as it reads back (tuples as lists)
            raise StalePiece(f"{path} was made with other settings ({made_with}) than this sweep's ({settings}): "
                             f"give another --out, or delete the piece to make it again")
        return res

    def cached(self, name: str, settings: dict, work) -> dict:
        """The piece's result from --out, else `work()`'s, saved there with its `settings`."""
        res = self.kept(name, settings)
        if res is not None:
            return res
        res = work()
        path = os.path.join(self.out, "results", f"{name}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({**res, "settings": settings}, f)
        os.replace(path + ".tmp", path)
        print(json.dumps({"piece": name, **res}), flush=True)
        return res

    def settings(self, warm: str, seed: int) -> list[str]:
        return [*TASK, *WARM[warm], f"trainer.seed={seed}", *self.extra]

    def first_piece(self, warm: str, seed: int) -> tuple[str, dict]:
        """The name and settings of the warm start's piece."""
        return f"first-{warm}-{seed}", {"n": self.n, "settings": self.settings(warm, seed)}

    def run_piece(self, warm: str, spec: str, seed: int) -> tuple[str, dict]:
        """The name and settings of one run's piece."""
        name = f"{warm}-{spec.replace(':', '')}-{seed}" + (f"-trace{self.trace}" if self.trace else "")
        return name, {"n": self.n, "train": [STEPS, *self.settings(warm, seed), *algo_args(spec)], "trace": self.trace}

    def evaluate(self, model: str, settings: list[str], name: str, target: str = "", seed: int = 0) -> dict:
        """Eval's overall metrics; with a target (sampled at eval.seed 0), the samples come from
        eval.seed `seed` (1): the same seed would draw the same random numbers, so a policy close
        to the warm start would repeat the target's samples and read closer than it is."""
        n = self.n
        ks = sorted({1, 4, 16, n} & set(range(1, n + 1)))
        out = os.path.join(self.out, "eval", name)
        sh([sys.executable, "-m", "reasonrl_fast.eval", *settings, f"model.path={model}", f"eval.seed={seed}",
            f"eval.n={n}", f"eval.k=[{','.join(map(str, ks))}]", "eval.temperature=1.0", "eval.top_p=1.0",
            *([f"eval.target={target}"] if target else []), f"eval.output_dir={out}"], f"eval of {name}")
        with open(os.path.join(out, "summary.json")) as f:
            overall = json.load(f)["overall"]
        keys = [f"mean@{n}", *[f"pass@{k}" for k in ks], f"distinct@{n}", f"entropy@{n}"]
        keys += [f"tv@{n}", f"tv_se@{n}", f"kl@{n}", f"kl_se@{n}"] if target else []
        return {k: overall.get(k) for k in keys}

    def first(self, warm: str, seed: int) -> dict:
        """The warm start, its eval (the target of the runs) and a second, independent eval of it
        against the first (the sampling floor of tv@n and kl@n)."""
        settings = self.settings(warm, seed)

        def work():
            t = time.time()
            _, path = sh([sys.executable, os.path.abspath(__file__), "--build-warm-start", *settings],
                         f"warm start {warm} {seed}")
            path = path.strip().splitlines()[-1]
            first = self.evaluate(path, settings, f"first-{warm}-{seed}")
            floor = self.evaluate(path, settings, f"floor-{warm}-{seed}", self.target(warm, seed), seed=1)
            return {"model": path, "first": first, "floor": floor, "wall_s": round(time.time() - t)}

        return self.cached(*self.first_piece(warm, seed), work)

    def target(self, warm: str, seed: int) -> str:
        return os.path.join(self.out, "eval", f"first-{warm}-{seed}")

    def run(self, warm: str, spec: str, seed: int, first: cf.Future) -> dict:
        name, _ = self.run_piece(warm, spec, seed)
        settings = self.settings(warm, seed)

        def work():
            first.result()  # the warm start is built and its target sampled
            out = os.path.join(self.out, "runs", name)
            shutil.rmtree(out, ignore_errors=True)
            saves = [f"trainer.save_every={self.trace}", "trainer.keep_checkpoints=0"] if self.trace else []
            wall, _ = sh([sys.executable, "-m", "reasonrl_fast.train", STEPS, *settings, *algo_args(spec),
                          "trainer.save_last=true", "trainer.progress=false", *saves, f"trainer.output_dir={out}"],
                         f"run {name}")
            ckpts = sorted((d for d in os.listdir(out) if d.startswith("checkpoint-")), key=lambda d: int(d[11:]))
            res = {"wall_s": round(wall)}
            if self.trace:
                res["trace"] = [{"step": int(c[11:]), **self.evaluate(os.path.join(out, c), settings, f"{name}-{c}",
                                                                      self.target(warm, seed), seed=1)} for c in ckpts]
                # the last checkpoint's eval is the trace's last point: same weights, settings and seed
                res["last"] = {k: v for k, v in res["trace"][-1].items() if k != "step"}
            else:
                res["last"] = self.evaluate(os.path.join(out, ckpts[-1]), settings, name, self.target(warm, seed),
                                            seed=1)
            for c in ckpts:  # the metrics stay; the weights are not needed again
                shutil.rmtree(os.path.join(out, c))
            return res

        return self.cached(*self.run_piece(warm, spec, seed), work)


def mean_se(values: list) -> str:
    """Mean ± standard error over the seeds that have the figure."""
    xs = [x for x in values if x is not None]
    if not xs:
        return "-"
    m = statistics.fmean(xs)
    if len(values) == 1:  # one seed: no spread to give
        return f"{m:.3f}"
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return f"{m:.3f} ± {se:.3f}" + (f" ({len(xs)} of {len(values)} seeds)" if len(xs) < len(values) else "")


def table(firsts: dict, runs: dict, warms: list[str], specs: list[str], seeds: list[int], n: int,
          extra: list[str]) -> str:
    keys = list(dict.fromkeys([f"mean@{n}", "pass@4", f"pass@{n}", f"distinct@{n}", f"entropy@{n}", f"tv@{n}",
                               f"kl@{n}"]))
    today = datetime.date.today().isoformat()
    lines = [f"### Partition task, {len(seeds)} seeds ({today}, {os.cpu_count()}-core CPU; "
             f"`python benchmarks/bench_diversity.py{' ' + ' '.join(extra) if extra else ''}`)", "",
             f"Eval on the held-out split at temperature 1, {n} samples per prompt; mean ± standard error over "
             f"seeds {', '.join(map(str, seeds))}. tv@{n} and kl@{n}: distance of the right answers from the "
             f"target's (the warm start's own, renormalised); the floor row is a second, independent sample of "
             f"the warm start against the first.", "",
             "| warm start | policy | " + " | ".join(keys) + " | wall per run (s) |",
             "|---|---|" + "---|" * len(keys) + "---:|"]
    for w in warms:
        fl = [firsts[w, s]["floor"] for s in seeds]
        lines.append(f"| {w} | warm start | " + " | ".join(
            mean_se([firsts[w, s]["first"].get(k) if not k.startswith(("tv", "kl")) else fl[i].get(k)
                     for i, s in enumerate(seeds)]) for k in keys) + " | - |")
        for spec in specs:
            rs = [runs[w, spec, s] for s in seeds]
            lines.append(f"| {w} | {label(spec)} | " + " | ".join(mean_se([r["last"].get(k) for r in rs]) for k in keys)
                         + f" | {statistics.fmean(r['wall_s'] for r in rs):.0f} |")
    return "\n".join(lines)


def log_partition(beta: float, tokens: float, p_right: float, right: int, group: int) -> float:
    """log Z* that FlowRL's length-normalised residual needs on a prompt whose group of `group`
    samples has `right` right ones (0/1 rewards): (1/n) log sum_y π_ref(y) exp(n β r̂(y)), with r̂
    the group-normalised reward (docs/math.md §Group advantage, ε left out) and n = `tokens`, the
    responses' common length; p_right = π_ref's chance of a right answer on the prompt."""
    mean = right / group
    std = math.sqrt(right * (group - right) / (group * (group - 1)))
    hi, lo = (1 - mean) / std, -mean / std
    a, b = math.log(p_right) + tokens * beta * hi, math.log(1 - p_right) + tokens * beta * lo
    return (max(a, b) + math.log1p(math.exp(-abs(a - b)))) / tokens


def residual_table(out: str, firsts: dict, warms: list[str], specs: list[str], seeds: list[int], n: int) -> str:
    """What FlowRL's Z-head learns against the log-partition its residual needs: the mean of
    log_z/mean and of |δ| over each run's last 100 steps (mean ± se over seeds), beside log Z* of
    a group of 8 with 7 and with 4 right, at the warm start's accuracy and response length."""
    from reasonrl_fast.util import read_metrics

    lines = ["| warm start | policy | learned log Z | mean abs(δ) | log Z*, 7 of 8 right | log Z*, 4 of 8 right |",
             "|---|---|---|---|---|---|"]
    for w in warms:
        p = statistics.fmean(firsts[w, s]["first"][f"mean@{n}"] for s in seeds)
        tokens = []
        for s in seeds:
            with open(os.path.join(out, "eval", f"first-{w}-{s}", "summary.json")) as f:
                tokens.append(json.load(f)["overall"]["response_length/mean"])
        tok = statistics.fmean(tokens)
        for spec in specs:
            if not spec.startswith("flowrl"):
                continue
            beta = float(spec.partition(":")[2] or 15)
            z, d = [], []
            for s in seeds:
                rows = [r for r in read_metrics(os.path.join(out, "runs", f"{w}-{spec.replace(':', '')}-{s}"))
                        if "log_z/mean" in r][-100:]
                z.append(statistics.fmean(r["log_z/mean"] for r in rows))
                d.append(statistics.fmean(r["tb/delta_abs_mean"] for r in rows))
            need = [f"{log_partition(beta, tok, p, c, 8):.3f}" if 0 < p < 1 else "-" for c in (7, 4)]
            lines.append(f"| {w} | {label(spec)} | {mean_se(z)} | {mean_se(d)} | {need[0]} | {need[1]} |")
    return "\n".join(lines)


def figure(firsts: dict, runs: dict, warms: list[str], specs: list[str], seeds: list[int], n: int, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    names = ["warm start", *map(label, specs)]
    width = 0.8 / len(warms)
    for ax, key in zip(axes, (f"tv@{n}", f"distinct@{n}", f"mean@{n}")):
        for j, w in enumerate(warms):
            cols = [[(firsts[w, s]["floor"] if key.startswith("tv") else firsts[w, s]["first"])[key] for s in seeds]]
            cols += [[runs[w, spec, s]["last"][key] for s in seeds] for spec in specs]
            cols = [[x for x in c if x is not None] for c in cols]  # tv@n: None without right answers
            means = [statistics.fmean(c) if c else math.nan for c in cols]
            ses = [statistics.stdev(c) / math.sqrt(len(c)) if len(c) > 1 else 0 for c in cols]
            ax.bar([i + j * width for i in range(len(cols))], means, width, yerr=ses, capsize=3, label=w)
        ax.set_xticks([i + width * (len(warms) - 1) / 2 for i in range(len(names))], names, rotation=20)
        ax.set_title(key + (" (warm start: its floor)" if key.startswith("tv") else "") + f", {len(seeds)} seeds")
        ax.legend(title="warm start")
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def trace_table(firsts: dict, runs: dict, warms: list[str], specs: list[str], seeds: list[int], n: int,
                command: str) -> str:
    """--trace: the distance and diversity at each saved step, mean ± se over seeds."""
    keys = [f"tv@{n}", f"kl@{n}", f"distinct@{n}", f"mean@{n}"]
    lines = [f"### Over training, seeds {', '.join(map(str, seeds))} ({datetime.date.today().isoformat()}, "
             f"{os.cpu_count()}-core CPU; `{command}`)", "", "| warm start | policy | step | " + " | ".join(keys) + " |",
             "|---|---|---:|" + "---|" * len(keys)]
    for w in warms:
        lines.append(f"| {w} | floor | - | " + " | ".join(
            mean_se([firsts[w, s]["floor"].get(k) for s in seeds]) for k in keys) + " |")
        for spec in specs:
            traces = [runs[w, spec, s]["trace"] for s in seeds]
            for i, point in enumerate(traces[0]):
                lines.append(f"| {w} | {label(spec)} | {point['step']} | " + " | ".join(
                    mean_se([t[i].get(k) for t in traces]) for k in keys) + " |")
    return "\n".join(lines)


def trace_figure(firsts: dict, runs: dict, warms: list[str], specs: list[str], seeds: list[int], n: int,
                 png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(warms), figsize=(6 * len(warms), 3.8), squeeze=False)
    for ax, w in zip(axes[0], warms):
        floor = [firsts[w, s]["floor"][f"tv@{n}"] for s in seeds]
        floor = [x for x in floor if x is not None]
        if floor:
            ax.axhline(statistics.fmean(floor), color="gray", ls="--", label="floor (warm start vs itself)")
        for spec in specs:
            traces = [runs[w, spec, s]["trace"] for s in seeds]
            steps = [p["step"] for p in traces[0]]
            ys = [[t[i][f"tv@{n}"] for t in traces if t[i][f"tv@{n}"] is not None] for i in range(len(steps))]
            ax.plot(steps, [statistics.fmean(y) if y else math.nan for y in ys], marker="o", label=label(spec))
        ax.set_title(f"tv@{n} to the target over training ({w} warm start, {len(seeds)} seeds)")
        ax.set_xlabel("step")
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def build_warm_start(settings: list[str]) -> None:
    from reasonrl_fast.config import load_config
    from reasonrl_fast.trainer.sft import warm_start

    print(warm_start(load_config(None, settings), log=lambda _: None))


def main() -> None:
    if sys.argv[1:2] == ["--build-warm-start"]:
        return build_warm_start(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", metavar="RESULTS.md")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--algos", default="grpo,flowrl:1,flowrl:5,flowrl:15")
    p.add_argument("--warm", default="narrow,flat")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", help="where the pieces are kept (default: a temporary directory)")
    p.add_argument("--trace", type=int, default=0, metavar="K", help="evaluate a checkpoint every K steps")
    a, extra = p.parse_known_args()
    seeds, specs, warms = [int(s) for s in a.seeds.split(",")], a.algos.split(","), a.warm.split(",")
    for w in warms:
        if w not in WARM:
            sys.exit(f"--warm: {w!r} is not one of {', '.join(WARM)}")
    tmp = None if a.out else tempfile.mkdtemp(prefix="bench_diversity_")
    sweep = Sweep(a.out or tmp, a.n, extra, a.trace)
    try:
        # every kept piece checked before any work starts: the pool would finish its queue first
        for s in seeds:
            for w in warms:
                sweep.kept(*sweep.first_piece(w, s))
                for spec in specs:
                    sweep.kept(*sweep.run_piece(w, spec, s))
        with cf.ThreadPoolExecutor(a.jobs) as pool:  # first pieces are queued first: runs wait on them
            ff = {(w, s): pool.submit(sweep.first, w, s) for s in seeds for w in warms}
            rf = {(w, spec, s): pool.submit(sweep.run, w, spec, s, ff[w, s])
                  for s in seeds for w in warms for spec in specs}
            firsts = {k: f.result() for k, f in ff.items()}
            runs = {k: f.result() for k, f in rf.items()}
    except RuntimeError as e:
        sys.exit(str(e))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if a.trace:  # its own section and figure: a trace is a few seeds, the table below the whole sweep
        if a.write:
            png = os.path.join(os.path.dirname(os.path.abspath(a.write)), "partition_diversity_trace.png")
            trace_figure(firsts, runs, warms, specs, seeds, a.n, png)
            print(f"wrote {png}")
        command = "python benchmarks/bench_diversity.py " + " ".join(
            [f"--seeds {a.seeds}", f"--warm {a.warm}", f"--algos {a.algos}", f"--trace {a.trace}", *extra])
        publish(trace_table(firsts, runs, warms, specs, seeds, a.n, command), a.write, MARKER + "-trace")
        return
    if a.write:
        png = os.path.join(os.path.dirname(os.path.abspath(a.write)), "partition_diversity.png")
        figure(firsts, runs, warms, specs, seeds, a.n, png)
        print(f"wrote {png}")
    body = table(firsts, runs, warms, specs, seeds, a.n, extra)
    if a.out and any(s.startswith("flowrl") for s in specs):  # the runs' metrics are kept under --out
        body += "\n\nFlowRL's Z-head against the log-partition its residual needs (last 100 steps):\n\n"
        body += residual_table(a.out, firsts, warms, specs, seeds, a.n)
    publish(body, a.write, MARKER)


if __name__ == "__main__":
    main()
