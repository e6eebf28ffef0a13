"""Where our step time goes on bench_vs_trl.py's work (CPU; a measurement, not a test).

    python benchmarks/profile_trainer.py driver [--steps 8] [--layout 2x1]
    python benchmarks/profile_trainer.py worker [--steps 6] [--world 2] [--threads 1]
    python benchmarks/profile_trainer.py worker --smoke    # 3 steps, 1 rank, short tables: seconds

driver: the whole trainer in this process under cProfile (Ray workers run elsewhere: what shows
here is the driver's own work and its waits), the top entries by cumulative and own time.
worker: `world` processes each build a trainer Worker (the Ray actor's class, without Ray),
join one gloo group and run rollout -> reward -> train_step on rank-local prompts; steps 3..
are profiled on rank 0 with torch.profiler (operators, collectives included) and cProfile
(Python), and the split of train_step into building the micro-batches (update.micro_batch),
forward, backward, clip, optimiser and weight sync is timed by wrapping those calls. The
trainer's own metrics (time/rollout_s, time/update_s, ...) give the phases of a step; this gives
what inside them costs."""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import os
import pstats
import socket
import sys
import tempfile
import time

import checkout  # noqa: F401  (before the package: this checkout's)

PROMPTS, SAMPLES = 8, 8  # per step, as bench_vs_trl.py's runs


def _top(prof: cProfile.Profile, key: str, n: int, *only: str) -> str:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(key).print_stats(*only, n)
    return s.getvalue()


def driver(steps: int, layout: str, rows_shown: int) -> None:
    from bench_vs_trl import LAYOUTS, ours_overrides
    from vs_trl_task import write_model, write_prompts

    from reasonrl_fast.config import load_config
    from reasonrl_fast.trainer.loop import run

    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(os.path.join(tmp, "model"))
        prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"))
        w, t = LAYOUTS[layout]
        cfg = load_config(None, ours_overrides(model, prompts, os.path.join(tmp, "run"), w, t, steps))
        prof = cProfile.Profile()
        prof.enable()
        run(cfg, log=lambda *_: None)
        prof.disable()
    print(_top(prof, "cumulative", rows_shown + 20))
    print(_top(prof, "tottime", rows_shown - 5))
    # the driver's own work inside the loop (decoding, scoring, batching, logging)
    print(_top(prof, "cumulative", rows_shown + 5, "reasonrl_fast|tokenization|subprocess|queues"))


def _timed(obj, name: str, acc: dict, key: str) -> None:
    """Wrap `obj.name` so that its wall time adds to acc[key]."""
    fn = getattr(obj, name)

    @functools.wraps(fn)  # keeps what a wrapper of it marks on it (the lr scheduler's, on optimizer.step)
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t

    setattr(obj, name, wrapper)


def _rank(rank: int, world: int, threads: int, port: int, model: str, prompts: str, steps: int, out_dir: str,
          rows_shown: int) -> None:
    import json

    import torch
    from bench_vs_trl import ours_overrides
    from torch.profiler import ProfilerActivity, profile
    from vs_trl_task import sum_reward

    from reasonrl_fast.algos import advantages
    from reasonrl_fast.config import load_config
    from reasonrl_fast.rollout import get_rollout, sample_seeds
    from reasonrl_fast.trainer import update
    from reasonrl_fast.trainer import worker as worker_mod

    cfg = load_config(None, ours_overrides(model, prompts, out_dir, world, threads, steps))
    w = worker_mod.Worker(cfg, rank, world, model, get_rollout(cfg.rollout.backend))
    w.setup("127.0.0.1", port)
    rows = [json.loads(x) for x in open(prompts)][: PROMPTS * steps]
    acc: dict[str, float] = {}
    _timed(update, "micro_batch", acc, "micro_batch")
    _timed(w.opt, "step", acc, "optimizer.step")
    _timed(worker_mod, "clip_grad_norm", acc, "clip_grad_norm")
    _timed(w, "sync_weights", acc, "sync_weights")
    _timed(torch.Tensor, "backward", acc, "backward")
    _timed(w.actor, "forward", acc, "actor forward")
    per = PROMPTS // world
    prof, tprof, t_gen, t_train = cProfile.Profile(), None, 0.0, 0.0
    for step in range(1, steps + 1):
        first = (step - 1) * PROMPTS + rank * per
        mine = rows[first:first + per]
        ids = [w.tok(r["prompt"])["input_ids"] for r in mine]
        if step == 3:
            acc.clear()
            tprof = profile(activities=[ProfilerActivity.CPU])
            tprof.__enter__()
            prof.enable()
        t = time.perf_counter()
        seeds = sample_seeds(cfg.trainer.seed, step, rank * per * SAMPLES, per * SAMPLES)
        resp = w.generate(ids, SAMPLES, cfg.rollout.temperature, cfg.rollout.top_p, seeds, keep=True)
        t_gen += time.perf_counter() - t if step >= 3 else 0.0
        texts = w.tok.batch_decode(resp, skip_special_tokens=True)
        rew = torch.tensor([sum_reward(x, mine[i // SAMPLES]["answer"]) for i, x in enumerate(texts)])
        adv = advantages(rew, torch.arange(per).repeat_interleave(SAMPLES), norm_by_std=True)
        t = time.perf_counter()
        w.train_step(adv.tolist(), step)
        t_train += time.perf_counter() - t if step >= 3 else 0.0
    prof.disable()
    tprof.__exit__(None, None, None)
    if rank == 0:
        n = steps - 2
        print(f"rank 0 over steps 3..{steps}, per step: generate {t_gen / n:.3f} s, train_step {t_train / n:.3f} s")
        for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
            print(f"  {k:<18} {v / n:.4f} s")
        print(tprof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows_shown))
        print(_top(prof, "tottime", rows_shown))
        print(_top(prof, "cumulative", rows_shown + 15))
    w.shutdown()


def workers(steps: int, world: int, threads: int, rows_shown: int) -> None:
    import torch.multiprocessing as mp
    from vs_trl_task import write_model, write_prompts

    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(os.path.join(tmp, "model"))
        prompts = write_prompts(os.path.join(tmp, "prompts.jsonl"))
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_rank, args=(r, world, threads, port, model, prompts, steps,
                                                 os.path.join(tmp, "run"), rows_shown))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        bad = [r for r, p in enumerate(procs) if p.exitcode]
        if bad:
            sys.exit(f"ranks {bad} failed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["driver", "worker"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--layout", default="2x1", choices=["2x1", "1x2"])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="worker: torch threads per rank")
    ap.add_argument("--smoke", action="store_true", help="3 steps, one worker (1x2 / --world 1), short tables: "
                    "a check that it runs")
    a = ap.parse_args()
    rows_shown = 25
    if a.smoke:
        a.steps, a.layout, a.world, rows_shown = 3, "1x2", 1, 8
    if a.steps < 3:
        sys.exit(f"--steps {a.steps}: steps 3.. are profiled, so at least 3")
    if PROMPTS % a.world:
        sys.exit(f"--world {a.world}: the {PROMPTS} prompts of a step must split evenly over the ranks")
    if a.what == "driver":
        driver(a.steps, a.layout, rows_shown)
    else:
        workers(a.steps, a.world, a.threads, rows_shown)


if __name__ == "__main__":
    main()
