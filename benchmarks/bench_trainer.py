"""Step time, tokens/s and the phase split of a trainer run (not a timed test).

    python benchmarks/bench_trainer.py RUN_DIR                 # summarise an existing run
    python benchmarks/bench_trainer.py --run [key=value ...]   # run the default first

Phases per step: rollout, reward, log-probs (old/ref), update, weight sync; "other" is the rest
of the step (Ray round trips, batching, advantages). The first step is left out (warm-up)."""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reasonrl_fast.util import read_metrics  # noqa: E402

PHASES = ["time/rollout_s", "time/reward_s", "time/logprob_s", "time/update_s", "time/sync_s"]


def summarise(run_dir: str) -> str:
    rows = read_metrics(run_dir)
    steps = [r for r in rows if "time/step_s" in r][1:]
    vals = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
    if not steps:
        return "no steps"
    mean = lambda k: statistics.fmean(r[k] for r in steps if r.get(k) is not None)  # noqa: E731
    step = mean("time/step_s")
    lines = [f"run: {run_dir} ({len(steps) + 1} steps)",
             f"step time: {step:.3f} s (median {statistics.median(r['time/step_s'] for r in steps):.3f} s)",
             f"tokens/s: {mean('perf/tokens_per_s'):.0f}",
             f"peak memory per worker: {max(r['memory/peak_gb'] for r in steps):.2f} GB"]
    other = step
    for k in PHASES:
        v = mean(k)
        other -= v
        lines.append(f"  {k[5:-2]:<8} {v:.3f} s  {100 * v / step:5.1f} %")
    lines.append(f"  {'other':<8} {other:.3f} s  {100 * other / step:5.1f} %")
    if vals:
        lines.append(f"val/accuracy: first {vals[0]:.3f}, last {vals[-1]:.3f}, best {max(vals):.3f}")
    return "\n".join(lines)


def main(argv):
    if argv and argv[0] == "--run":
        from reasonrl_fast.train import main as train

        overrides = argv[1:]
        train(overrides)
        out = next((o.split("=", 1)[1] for o in overrides if o.startswith("trainer.output_dir=")), "runs/default")
        print(summarise(out))
    elif argv:
        print(summarise(argv[0]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
