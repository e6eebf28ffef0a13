"""Our trainer against TRL's GRPOTrainer on the same work, side by side (CPU, not a timed test).

    python benchmarks/bench_vs_trl.py --trl-python ~/.cache/reasonrl_fast/venv-trl-1.16/bin/python \
        [--rounds 3] [--steps 10] [--write]
    python benchmarks/bench_vs_trl.py --trl-python ... --smoke    # one 3-step run each, 1x2 only; nothing written

The work (benchmarks/vs_trl_task.py): a random tiny Qwen2 (hidden 128, 4 layers, 4 heads / 2 KV
heads, MLP 384, tied embeddings, a 26-token character vocabulary), `AB+CD=` prompts, reward 1
when the sum appears as a run of digits; 8 prompts x 8 samples per step, 16 new tokens,
temperature 1, GRPO without KL, lr 1e-4, fp32. Ours runs in two layouts (2 workers x 1 thread,
1 worker x 2 threads), TRL in one process with 2 threads. Runs alternate (ours 2x1, TRL, ours
1x2, TRL) for `--rounds` rounds, so a change in the machine's load falls on both sides. The
score of a run is the median step time over steps 3..steps; a side's number is the median of
its runs, and each layout's ratio uses the TRL runs that followed it. Our step time is
`time/step_s` from metrics.jsonl; TRL's is the wall time between two steps' ends (callback)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

from checkout import HERE, ROOT, child_env
from results_md import write_section
from vs_trl_task import write_model, write_prompts

from reasonrl_fast.util import read_metrics

LAYOUTS = {"2x1": (2, 1), "1x2": (1, 2)}  # workers x threads per worker
PHASES = ["time/rollout_s", "time/reward_s", "time/logprob_s", "time/update_s", "time/sync_s"]


def ours_overrides(model: str, prompts: str, out: str, workers: int, threads: int, steps: int) -> list[str]:
    """The trainer's overrides for the benchmark's work (also used by profile_trainer.py)."""
    return ["algo=grpo", f"model.path={model}", "model.dtype=float32", f"data.train_files=[{prompts}]",
            f"data.reward_fn={os.path.join(HERE, 'vs_trl_task.py')}:compute_score",
            "data.prompts_per_step=8", "optim.mini_batch_prompts=8", "rollout.n=8",
            "rollout.max_new_tokens=16", "rollout.temperature=1.0", "grpo.kl_coef=0", "optim.lr=1e-4",
            f"trainer.steps={steps}", "trainer.val_every=0", f"trainer.workers_per_node={workers}",
            f"trainer.cpus_per_worker={threads}", "trainer.logger=none", "trainer.progress=false",
            f"trainer.output_dir={out}", "trainer.overwrite=true"]


def run_ours(model: str, prompts: str, tmp: str, layout: str, steps: int) -> dict:
    out = tempfile.mkdtemp(dir=tmp, prefix=f"ours-{layout}-")
    w, t = LAYOUTS[layout]
    cmd = [sys.executable, "-m", "reasonrl_fast.train", *ours_overrides(model, prompts, out, w, t, steps)]
    p = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=900)
    if p.returncode:
        sys.exit(f"our trainer failed ({layout}):\n{p.stderr[-3000:]}")
    rows = read_metrics(out)
    timed = [r for r in rows if r.get("step", 0) >= 3 and "time/step_s" in r]
    phases = {k: statistics.median(r[k] for r in timed) for k in PHASES + ["time/step_s"]}
    return {"step_s": statistics.median(r["time/step_s"] for r in timed), "phases": phases}


def run_trl(trl_python: str, model: str, prompts: str, tmp: str, steps: int) -> dict:
    out = os.path.join(tempfile.mkdtemp(dir=tmp, prefix="trl-"), "times.json")
    cmd = [trl_python, os.path.join(HERE, "vs_trl_trl.py"), model, prompts, out, "--steps", str(steps),
           "--threads", "2"]
    p = subprocess.run(cmd, cwd=ROOT, env=child_env(OMP_NUM_THREADS="2"), capture_output=True,
                       text=True, timeout=900)
    if p.returncode:
        sys.exit(f"TRL run failed ({trl_python}):\n{p.stderr[-3000:]}")
    times = json.load(open(out))["step_s"]
    return {"step_s": statistics.median(times[2:])}  # steps 3..steps


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def _runs(xs: list[dict]) -> str:
    return ", ".join(f"{x['step_s']:.3f}" for x in xs)


def table(res: dict, load_before: str, load_after: str, rounds: int, steps: int) -> str:
    today = datetime.date.today().isoformat()
    cpu = platform.processor() or platform.machine()
    lines = [f"### Trainer vs TRL GRPOTrainer ({today}, {os.cpu_count()}-core CPU ({cpu}), load "
             f"{load_before} at the start and {load_after} at the end; `python benchmarks/bench_vs_trl.py "
             f"--rounds {rounds} --steps {steps}`)", "",
             "Median step time over steps 3..10 (s); each run's median, then the median over runs.", "",
             "| layout | ours (runs) | TRL after it (runs) | ours | TRL | ours / TRL |",
             "|---|---|---|---:|---:|---:|"]
    for layout in res:
        o, t = res[layout]["ours"], res[layout]["trl"]
        mo, mt = statistics.median(x["step_s"] for x in o), statistics.median(x["step_s"] for x in t)
        lines.append(f"| ours {layout} (workers x threads) vs TRL (1 process x 2 threads) | "
                     f"{_runs(o)} | {_runs(t)} | "
                     f"{mo:.3f} | {mt:.3f} | {mo / mt:.2f} |")
    lines += ["", "Our phase split (median over runs of each run's median, s):", "",
              "| layout | step | rollout | reward | log-probs | update | weight sync | other |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for layout in res:
        ph = {k: statistics.median(x["phases"][k] for x in res[layout]["ours"]) for k in PHASES + ["time/step_s"]}
        other = ph["time/step_s"] - sum(ph[k] for k in PHASES)
        lines.append(f"| {layout} | {ph['time/step_s']:.3f} | " + " | ".join(f"{ph[k]:.3f}" for k in PHASES)
                     + f" | {other:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trl-python", required=True, help="the Python of a venv with trl 1.16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    ap.add_argument("--smoke", action="store_true", help="one round of 3 steps, the 1x2 layout only, nothing "
                    "written: a check that it runs")
    a = ap.parse_args()
    layouts = list(LAYOUTS)
    if a.smoke:
        a.rounds, a.steps, a.write, layouts = 1, 3, False, ["1x2"]
    if not os.path.isfile(a.trl_python):
        sys.exit(f"--trl-python {a.trl_python}: no such file")
    if a.steps < 3:
        sys.exit(f"--steps {a.steps}: the median is taken over steps 3..steps, so at least 3")
    res = {layout: {"ours": [], "trl": []} for layout in layouts}
    load_before = load()
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(os.path.join(tmp, "model"))
        prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"))
        for r in range(a.rounds):
            for layout in layouts:
                res[layout]["ours"].append(run_ours(model, prompts, tmp, layout, a.steps))
                res[layout]["trl"].append(run_trl(a.trl_python, model, prompts, tmp, a.steps))
                print(f"round {r + 1} {layout}: ours {res[layout]['ours'][-1]['step_s']:.3f} s, "
                      f"TRL {res[layout]['trl'][-1]['step_s']:.3f} s (load {load()})", flush=True)
    body = table(res, load_before, load(), a.rounds, a.steps)
    print(body)
    if a.write:
        write_section(os.path.join(HERE, "RESULTS.md"), body, "vs-trl")


if __name__ == "__main__":
    main()
