"""Ulysses sequence parallel on CPU: two gloo ranks training on the same samples with each row
whole on one rank (SP=1: data parallel, each rank half of the rows) or each row cut over both
(SP=2: each rank half of every row's tokens), side by side in one run (not a timed test).

    python benchmarks/bench_sequence_parallel.py [--write benchmarks/RESULTS.md] [--reps 5] [--length 2048]
    python benchmarks/bench_sequence_parallel.py --smoke       # tiny sizes, seconds (tests/test_benchmarks.py)

The work of one rank in one step, what `trainer/update.py` runs for a mini-batch: for each
micro-batch (one packed row, as the trainer packs one under sequence parallel) the actor's
forward (trainer/policy.py `Actor`: log-probs and entropies of the response tokens, the unfused
head), a GRPO-like loss (the advantage-weighted log-probs' sum) and its backward, then the
gradients summed over the ranks (one all-reduce per parameter, in both settings). float32, sdpa,
train mode, one torch thread per rank (a trainer worker's `trainer.cpus_per_worker=1`).

Model: a Qwen2 built from a config (random weights, nothing downloaded): hidden 256, 4 layers,
8 heads / 4 KV heads, MLP 1024, vocabulary 4096, untied head. Samples: 4 sequences, prompt 64
tokens and response --length - 64, one micro-batch each (SP=1: rank r trains on samples r and
r + 2; SP=2: both ranks on all four, each on its half of every row).

Per setting: the step's time (median and range of --reps after one warm-up, the settings in
turn, each round in another order), and per rank the growth of the resident set during one
step (harness.peak_memory_mb, after a warm-up step, gradients set to None before it) and the
tokens one forward sees. The summed gradient of SP=2 is checked against SP=1's (the same loss
of the same samples: equal up to float32 rounding).
"""

from __future__ import annotations

import argparse
import copy
import os
import queue
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import harness
from results_md import publish

MARKER = "sequence-parallel-cpu"
HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES = 4
PROMPT = 64


def _model(smoke: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from reasonrl_fast.trainer.policy import Actor

    size = ({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 512} if smoke else
            {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "vocab_size": 4096})
    cfg = Qwen2Config(num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=8192,
                      tie_word_embeddings=False, **size)
    torch.manual_seed(0)
    return Actor(Qwen2ForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa"), fused=False).train()


def _rank(rank: int, port: int, args, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from reasonrl_fast.models import ulysses
    from reasonrl_fast.trainer.policy import make_packed_batch

    g = torch.Generator().manual_seed(1)
    vocab = 512 if args.smoke else 4096
    prompts = [torch.randint(3, vocab, (PROMPT,), generator=g).tolist() for _ in range(SAMPLES)]
    responses = [torch.randint(3, vocab, (args.length - PROMPT,), generator=g).tolist() for _ in range(SAMPLES)]
    adv = torch.randn(SAMPLES, generator=g)
    plain = _model(args.smoke)
    sp = copy.deepcopy(plain)
    ulysses.use_ulysses(sp.lm)
    sp.sp_group = dist.group.WORLD
    settings = {"SP=1 (rows whole, 2 data-parallel ranks)": (plain, range(rank, SAMPLES, 2)),
                "SP=2 (every row cut over both ranks)": (sp, range(SAMPLES))}
    batches = {i: make_packed_batch([prompts[i]], [responses[i]], "cpu", one_row=True) for i in range(SAMPLES)}

    def step(name):
        actor, mine = settings[name]
        for p in actor.parameters():
            p.grad = None
        for i in mine:
            lp, ent, _ = actor(batches[i], temperature=1.0, entropy=True)
            (-(lp.sum() * adv[i]) - 1e-3 * ent.sum()).backward()
        for p in actor.parameters():
            dist.all_reduce(p.grad)

    times = {name: [] for name in settings}
    for name in settings:
        step(name)  # warm-up
    for r in range(args.reps):
        order = list(settings) if r % 2 == 0 else list(reversed(settings))
        for name in order:
            dist.barrier()
            t0 = time.perf_counter()
            step(name)
            dist.barrier()
            times[name].append(time.perf_counter() - t0)
    grads = {name: torch.cat([p.grad.reshape(-1) for p in settings[name][0].parameters()]) for name in settings}
    a, b = grads.values()
    rel = ((a - b).abs().max() / a.abs().max()).item()
    peaks = {}
    for name in settings:
        dist.barrier()
        peaks[name] = harness.peak_memory_mb(lambda name=name: step(name), "cpu")
    tokens = {name: args.length // (1 if name.startswith("SP=1") else 2) for name in settings}
    out.put((rank, {"times": times, "peaks": peaks, "tokens": tokens, "grad_rel": rel}))
    dist.barrier()
    dist.destroy_process_group()


def run(args) -> tuple[list[dict], dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, args, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    try:
        while len(results) < len(procs):  # a rank that dies ends the run, not a wait for its result
            try:
                rank, res = out.get(timeout=5)
                results[rank] = res
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    raise SystemExit(f"bench_sequence_parallel: rank {dead[0]} exited with {procs[dead[0]].exitcode}")
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    rows = []
    for name in results[0]["times"]:
        t = results[0]["times"][name]
        rows.append({"setting": name, "tokens": results[0]["tokens"][name], "median_s": statistics.median(t),
                     "min_s": min(t), "max_s": max(t),
                     "peak_mb": [results[r]["peaks"][name] for r in (0, 1)]})
    return rows, {"grad_rel": max(results[r]["grad_rel"] for r in (0, 1))}


def table(rows: list[dict]) -> str:
    base = rows[0]["median_s"]
    lines = ["| setting | tokens per forward | step s (median, range) | vs SP=1 | peak MiB rank 0 / rank 1 |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        peaks = " / ".join(f"{p:.0f}" if p is not None else "-" for p in r["peak_mb"])
        lines.append(f"| {r['setting']} | {r['tokens']} | {r['median_s']:.2f} ({r['min_s']:.2f}-{r['max_s']:.2f}) | "
                     f"{r['median_s'] / base:.2f}x | {peaks} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--length", type=int, default=2048, help="tokens per sequence, prompt included")
    p.add_argument("--write", help="RESULTS.md to write the section into")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    if args.smoke:
        args.reps, args.length = 2, 128
    t0 = time.time()
    rows, check = run(args)
    info = harness.env_info("cpu")
    body = (f"{info['date_utc']}, {harness.machine_line(info)} (the driver's); 2 gloo ranks x 1 thread; {SAMPLES} samples of {args.length} tokens "
            f"(prompt {PROMPT}); {args.reps} steps per setting; {time.time() - t0:.0f} s in all.\n\n"
            f"{table(rows)}\n\nSP=2's summed gradient against SP=1's: max relative difference "
            f"{check['grad_rel']:.1e}.\n")
    if check["grad_rel"] > 1e-4:
        raise SystemExit(f"bench_sequence_parallel: the two settings' gradients differ ({check['grad_rel']:.1e}):\n"
                         + body)
    publish(body, args.write, MARKER)


if __name__ == "__main__":
    main()
