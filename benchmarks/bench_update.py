"""One worker's update on CPU with padded or packed rows, one forward or micro-batches by token
budget, with and without activation checkpointing (not a timed test).

    python benchmarks/bench_update.py [--write benchmarks/RESULTS.md] [--reps 5] [--threads 1]
    python benchmarks/bench_update.py --smoke          # tiny sizes, seconds (tests/test_benchmarks.py)

The work: what `trainer/worker.py` runs for one mini-batch, `update.accumulate` (the forwards
with entropy, the GRPO loss with token-mean, the backwards, gradients summed in .grad) and
nothing else; the micro-batches (`update.plan`) and their tensors (`update.micro_batch`) are
built once beforehand, as the worker builds them before the update. float32, sdpa attention,
the unfused LM head (what `model.fused_lm_head=auto` picks on CPU at this size), train mode.

Model: a Qwen2 built from a config (random weights, nothing downloaded): hidden 256, 4 layers,
8 heads / 4 KV heads, MLP 1024, vocabulary 4096, untied head (6.03 M parameters). Batch: 8
prompts x 8 responses; prompt lengths uniform in 20..60 (one per prompt); response lengths
long-tailed with a 10x spread: length = 12 x 10^(u^2), u uniform in [0, 1] (median about 21,
one in six above 60), with one response at exactly 12 and one at 120.

Settings (SETTINGS), all in the same run: padded rows / packed rows as long as the longest
sequence (the trainer's packing for sdpa) / one packed row (its packing for flash-attn), one forward
(`optim.micro_batch_tokens=0`) or micro-batches of at most --budget tokens, checkpointing off or
on (`models.loading.enable_checkpointing`). Per setting:
- time: the median and the range of --reps updates after --warmup, the settings interleaved
  round by round (each round in another order), so a change in the machine's load falls on all;
- positions: the token positions the forwards saw (rows x width summed over micro-batches:
  padding and packed rows' tails included) against the real tokens (prompt + response);
- peak: in a fresh subprocess per setting, after one warm-up update, the growth of the resident
  set during one update (harness.peak_memory_mb: VmHWM reset through /proc/self/clear_refs right
  before it, free heap pages handed back first), gradients set to None before it so their
  buffers count;
- saved: the bytes held for the backward, the largest micro-batch and the sum over micro-batches:
  the distinct storages autograd saves in one micro-batch's forward (a saved_tensors_hooks
  count, the parameters left out) and each decoder layer's input (what a checkpointed layer
  keeps instead). Deterministic: the activations checkpointing drops.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch

import harness
from results_md import publish

MARKER = "update-layouts-cpu"
MIB = 2**20

# name: (layout, budgeted, checkpointing); the first is the baseline. Layouts: padded rows;
# packed rows as long as the longest sequence (what the trainer packs into for sdpa and eager);
# one packed row (what it packs into for flash-attn's variable-length kernels, here through sdpa's
# block-diagonal mask, whose cost grows with the row's length squared).
SETTINGS = {
    "padded": ("padded", False, False),
    "packed": ("rows", False, False),
    "packed, one row": ("one row", False, False),
    "padded, budget": ("padded", True, False),
    "packed, budget": ("rows", True, False),
    "packed, one row, budget": ("one row", True, False),
    "packed, budget, checkpointing": ("rows", True, True),
    "packed, checkpointing": ("rows", False, True),
}

SIZES = {
    "full": dict(hidden=256, layers=4, heads=8, kv_heads=4, mlp=1024, vocab=4096, prompts=8, n=8,
                 prompt_len=(20, 60), response_len=(12, 120), budget=2048),
    "smoke": dict(hidden=32, layers=2, heads=4, kv_heads=2, mlp=64, vocab=64, prompts=2, n=4,
                  prompt_len=(3, 8), response_len=(2, 20), budget=48),
}


def samples(s: dict, seed: int = 0):
    """Prompts (one length per prompt, shared by its n responses), long-tailed responses, sampler
    log-probs and advantages."""
    rng = random.Random(seed)
    lo, hi = s["response_len"]
    prompts = []
    for _ in range(s["prompts"]):
        p = [rng.randrange(1, s["vocab"]) for _ in range(rng.randint(*s["prompt_len"]))]
        prompts += [p] * s["n"]
    lengths = [round(lo * (hi / lo) ** (rng.random() ** 2)) for _ in prompts]
    lengths[rng.randrange(len(lengths))] = lo  # the spread is exactly hi / lo
    lengths[max(range(len(lengths)), key=lambda i: (lengths[i] != lo, rng.random()))] = hi
    responses = [[rng.randrange(1, s["vocab"]) for _ in range(k)] for k in lengths]
    rollout = [[-3 * rng.random() for _ in r] for r in responses]
    adv = torch.tensor([rng.gauss(0, 1) for _ in responses])
    return prompts, responses, rollout, adv


def model(s: dict, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["mlp"],
                      num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                      num_key_value_heads=s["kv_heads"], max_position_embeddings=4096, tie_word_embeddings=False)
    return Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)


class Setting:
    """One setting's actor, micro-batches and update, built once."""

    def __init__(self, name: str, s: dict, lm=None):
        from reasonrl_fast.algos import get_algo
        from reasonrl_fast.config import load_config
        from reasonrl_fast.models.loading import enable_checkpointing
        from reasonrl_fast.trainer import update
        from reasonrl_fast.trainer.policy import Actor

        layout, budgeted, ckpt = SETTINGS[name]
        packed = layout != "padded"
        self.name, self.update = name, update
        self.cfg = load_config(None, ["algo=grpo", "grpo.loss_agg=token-mean", "rollout.correction=none",
                                      f"rollout.n={s['n']}"])
        self.algo = get_algo(self.cfg.algo)
        self.actor = Actor(lm if lm is not None else model(s)).train()
        if ckpt:
            enable_checkpointing(self.actor.lm)
        prompts, self.responses, rollout, self.adv = samples(s)
        budget = s["budget"] if budgeted else 0
        chunk = [slice(0, len(self.responses))]
        plans, totals = update.plan(prompts, self.responses, chunk, budget, packed,
                                    self.algo.loss_units(self.cfg), 1, "cpu")
        self.idxs, self.total = plans[0], totals[0]
        self.batches = [update.micro_batch(prompts, self.responses, rollout, idx, packed, 0, "cpu",
                                           one_row=layout == "one row") for idx in self.idxs]
        self.positions = sum(b["input_ids"].numel() for b, _ in self.batches)
        self.tokens = sum(len(p) + len(r) for p, r in zip(prompts, self.responses))

    def run(self, idxs=None, batches=None) -> None:
        self.update.accumulate(self.actor, self.algo, self.cfg, self.responses, idxs or self.idxs,
                               batches or self.batches, self.adv, self.total, 1)

    def __call__(self) -> None:
        """One update: gradients from None, as after the optimiser's zero_grad."""
        self.actor.zero_grad(set_to_none=True)
        self.run()

    def saved_bytes(self) -> tuple[int, int]:
        """(largest micro-batch, sum over micro-batches) of the bytes held for the backward: the
        distinct storages autograd saves in the forward, parameters left out, and each decoder
        layer's input (what a checkpointed layer keeps instead, outside autograd's saved tensors;
        without checkpointing its first op saves it anyway, counted once)."""
        from reasonrl_fast.models.loading import decoder_layers

        params = {p.untyped_storage().data_ptr() for p in self.actor.parameters()}
        seen: dict[int, int] = {}

        def count(t):
            st = t.untyped_storage()
            if st.data_ptr() not in params:  # a storage saved twice (views of it) is held once
                seen[st.data_ptr()] = st.nbytes()
            return t

        def layer_input(_module, args, kwargs):
            count(args[0] if args else kwargs["hidden_states"])

        hooks = [m.register_forward_pre_hook(layer_input, with_kwargs=True) for m in decoder_layers(self.actor.lm)]
        per = []
        try:
            for idx, batch in zip(self.idxs, self.batches):
                seen.clear()
                self.actor.zero_grad(set_to_none=True)
                with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
                    self.run([idx], [batch])
                per.append(sum(seen.values()))
        finally:
            for h in hooks:
                h.remove()
        return max(per), sum(per)


def timings(settings: list[Setting], reps: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per update of each setting, interleaved: round r runs the settings rotated by r."""
    times: dict[str, list[float]] = {s.name: [] for s in settings}
    for r in range(warmup + reps):
        for s in settings[r % len(settings):] + settings[:r % len(settings)]:
            t0 = time.perf_counter()
            s()
            if r >= warmup:
                times[s.name].append(time.perf_counter() - t0)
    return times


def peak_child(name: str, size: str, threads: int) -> dict:
    """In a fresh process: this setting's update peak above the resident set after its setup."""
    torch.set_num_threads(threads)
    s = Setting(name, SIZES[size])
    s()  # warm-up: lazily built kernels and caches are not the update's memory
    s.actor.zero_grad(set_to_none=True)
    return {"name": name, "peak_mib": harness.peak_memory_mb(s, "cpu")}


def peaks(names: list[str], size: str, threads: int, jobs: int) -> dict[str, dict]:
    """peak_child of each setting in its own process, `jobs` at a time. The processes are forked
    from a server that has imported torch and transformers and run nothing (forkserver): each
    starts with no tensor, allocator state or kernel cache of another setting, without paying the
    imports again."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "transformers", "reasonrl_fast.trainer.update"])
    with ProcessPoolExecutor(max(1, jobs), mp_context=ctx, max_tasks_per_child=1) as pool:
        rows = list(pool.map(peak_child, names, [size] * len(names), [threads] * len(names)))
    return {row["name"]: row for row in rows}


def length_summary(s: dict) -> str:
    prompts, responses, _, _ = samples(s)
    r = sorted(len(x) for x in responses)
    p = sorted({len(x) for x in prompts})
    return (f"prompt lengths {p[0]}..{p[-1]} (mean {statistics.mean(len(x) for x in prompts):.1f}); response lengths "
            f"min {r[0]}, median {statistics.median(r):g}, mean {statistics.mean(r):.1f}, 90th percentile "
            f"{r[min(len(r) - 1, int(0.9 * len(r)))]}, max {r[-1]} ({sum(x > r[-1] / 2 for x in r)} of {len(r)} above half the max)")


def rows(settings: list[Setting], times: dict, mem: dict, saved: dict) -> list[dict]:
    """One row per setting: what the table shows, in numbers."""
    base = statistics.median(times[settings[0].name])
    out = []
    for s in settings:
        t = times[s.name]
        largest, total = saved[s.name]
        out.append({"setting": s.name, "forwards": len(s.idxs), "positions": s.positions, "tokens": s.tokens,
                    "times_s": t, "median_s": statistics.median(t), "vs_padded": base / statistics.median(t),
                    "peak_mib": mem[s.name]["peak_mib"], "saved_largest_mib": largest / MIB,
                    "saved_all_mib": total / MIB})
    return out


def table(rows: list[dict]) -> str:
    lines = [("| setting | forwards | positions seen | real tokens | padding | ms per update (median) | "
              "range (ms) | vs padded | peak MiB | held for backward MiB (largest forward / all) |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:,.1f}"
        lines.append(f"| {r['setting']} | {r['forwards']} | {r['positions']:,} | {r['tokens']:,} | "
                     f"{100 * (1 - r['tokens'] / r['positions']):.0f}% | {1e3 * r['median_s']:,.0f} | "
                     f"{1e3 * min(r['times_s']):,.0f}-{1e3 * max(r['times_s']):,.0f} | {r['vs_padded']:.2f}x | "
                     f"{peak} | {r['saved_largest_mib']:,.1f} / {r['saved_all_mib']:,.1f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", metavar="RESULTS.md", help="put the table between its markers there")
    p.add_argument("--json", metavar="PATH", help="the rows as JSON there")
    p.add_argument("--reps", type=int, default=5, help="timed updates per setting (default 5; --smoke: 2)")
    p.add_argument("--warmup", type=int, default=1, help="untimed updates per setting first (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a trainer worker's "
                   "trainer.cpus_per_worker)")
    p.add_argument("--jobs", type=int, default=1, help="peak-memory processes at a time (default 1)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 2 repeats: a check that it runs")
    a = p.parse_args()
    reps = 2 if a.smoke and "--reps" not in sys.argv else a.reps
    if reps < 1 or a.warmup < 0 or a.threads < 1:
        p.error(f"--reps {reps} --warmup {a.warmup} --threads {a.threads}: at least 1 timed repeat and "
                f"1 thread, no negative warm-up")
    size = "smoke" if a.smoke else "full"
    s = SIZES[size]
    t_start, load0 = time.time(), os.getloadavg()[0]
    mem = peaks(list(SETTINGS), size, a.threads, a.jobs)  # first, while nothing runs beside them
    torch.set_num_threads(a.threads)
    lm_plain, lm_ckpt = model(s), model(s)  # the same weights; checkpointing is switched on one
    settings = [Setting(name, s, lm_ckpt if ckpt else lm_plain) for name, (_, _, ckpt) in SETTINGS.items()]
    params = sum(x.numel() for x in lm_plain.parameters())
    print(f"{params / 1e6:.2f} M parameters; {length_summary(s)}", flush=True)
    times = timings(settings, reps, a.warmup)
    saved = {x.name: x.saved_bytes() for x in settings}
    result = rows(settings, times, mem, saved)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"sizes": s, "parameters": params, "torch": torch.__version__, "threads": a.threads,
                       "reps": reps, "warmup": a.warmup, "rows": result}, f, indent=1)
    body = (f"### The update, padded against packed, with and without checkpointing "
            f"({time.strftime('%Y-%m-%d', time.gmtime())}, CPU {harness._cpu_name()}, {os.cpu_count()} cores, "
            f"{a.threads} torch thread(s); torch {torch.__version__}; load {load0:.1f} at the start and "
            f"{os.getloadavg()[0]:.1f} at the end; `python benchmarks/bench_update.py"
            f"{' --smoke' if a.smoke else ''}`, {time.time() - t_start:.0f} s)\n\n"
            f"Qwen2 hidden {s['hidden']}, {s['layers']} layers, {s['heads']} heads / {s['kv_heads']} KV heads, MLP "
            f"{s['mlp']}, vocabulary {s['vocab']} ({params / 1e6:.2f} M parameters), float32; {s['prompts']} prompts "
            f"x {s['n']} responses, {length_summary(s)}; GRPO token-mean; budget {s['budget']:,} tokens per "
            f"forward where set; median and range of {reps} updates after {a.warmup} warm-up per setting, "
            f"interleaved.\n\n" + table(result))
    publish(body, a.write, MARKER)


if __name__ == "__main__":
    main()
