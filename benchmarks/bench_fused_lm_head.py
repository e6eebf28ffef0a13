"""The trainer's update with and without the fused LM head (`model.fused_lm_head`), on CPU.

    python benchmarks/bench_fused_lm_head.py            # both tables, written to RESULTS.md
    python benchmarks/bench_fused_lm_head.py --quick    # fewer sizes, nothing written
    python benchmarks/bench_fused_lm_head.py --smoke    # one tiny row per table, seconds, nothing written

One update step as the trainer's worker runs it: `Actor.forward` with entropy, the GRPO loss
(token-mean, clip-higher) and its backward, on a batch of sequences of 16 prompt tokens and
256 response tokens (table 1; one shorter sequence below 256 tokens) or 32 (table 2).
Variants: unfused (the LM head on the response positions, then `token_logprob` on the
[tokens, V] logits) and fused (`linear_token_logprob` from the hidden states and the head
weight).

Table 1: a small Qwen2-style model built from a config (hidden 256, 2 layers) with Qwen2's
151,936-token vocabulary, at several token counts. Table 2: the embedded default's model
(hidden 128, 2 layers) at its per-worker update size (2,048 response tokens), over vocabulary
sizes: where the fused path starts to pay on CPU (layout/ FUSED_CPU_MIN_ELEMENTS).

Each (model, tokens, variant) runs in a fresh subprocess with one torch thread (as a trainer
worker with trainer.cpus_per_worker=1): peak memory is its maximum resident set size minus the
resident size just before the first step; time is the median of --reps steps after it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from checkout import HERE, ROOT
from results_md import write_section

PROMPT, RESPONSE = 16, 256


def _rss_now() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_one(variant: str, hidden: int, vocab: int, tokens: int, response: int, reps: int) -> dict:
    """One variant in this (fresh) process: peak RSS of the first step, median time after."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from reasonrl_fast.algos.grpo import grpo_loss
    from reasonrl_fast.trainer.policy import Actor, make_batch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=PROMPT + response, tie_word_embeddings=False)
    actor = Actor(Qwen2ForCausalLM(cfg), fused=variant == "fused")
    resp = min(response, tokens)
    b = max(1, tokens // resp)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, vocab, (PROMPT,), generator=g).tolist() for _ in range(b)]
    responses = [torch.randint(1, vocab, (resp,), generator=g).tolist() for _ in range(b)]
    batch = make_batch(prompts, responses, 0, "cpu")
    adv = torch.randn(b, generator=g)
    mask = batch["response_mask"]

    def step():
        actor.zero_grad(set_to_none=True)
        lp, ent, _ = actor(batch, 1.0, entropy=True)
        loss, _ = grpo_loss(lp, lp.detach(), adv, mask)
        loss.backward()
        return float((ent.detach() * mask).sum())

    rss0 = _rss_now()
    step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return {"variant": variant, "hidden": hidden, "vocab": vocab, "tokens": b * resp,
            "time_s": ts[len(ts) // 2], "peak_extra_bytes": int(peak)}


def measure(hidden: int, vocab: int, tokens: int, response: int, reps: int) -> dict:
    """Both variants, each in its own subprocess, one after the other."""
    out = {}
    for variant in ("unfused", "fused"):
        cmd = [sys.executable, __file__, "--one", variant, "--hidden", str(hidden), "--vocab",
               str(vocab), "--tokens", str(tokens), "--response", str(response),
               "--reps", str(reps)]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            raise SystemExit(f"{variant} H={hidden} V={vocab} N={tokens} failed:\n"
                             f"{r.stderr[-2000:]}")
        out[variant] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def _row(res: dict) -> str:
    u, f = res["unfused"], res["fused"]
    mib = 2**20
    return (f"| {u['tokens']:,} | {u['vocab']:,} | {u['tokens'] * u['vocab'] / 1e6:,.1f} "
            f"| {u['time_s'] * 1e3:,.0f} | {f['time_s'] * 1e3:,.0f} "
            f"| {u['time_s'] / f['time_s']:.2f} "
            f"| {u['peak_extra_bytes'] / mib:,.0f} | {f['peak_extra_bytes'] / mib:,.0f} |")


HEADER = ("| tokens | vocabulary | tokens x V (M) | unfused ms | fused ms | speed-up "
          "| unfused peak MiB | fused peak MiB |\n|---:|---:|---:|---:|---:|---:|---:|---:|")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--response", type=int, default=RESPONSE)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="fewer sizes; RESULTS.md is left alone")
    p.add_argument("--smoke", action="store_true", help="one tiny row per table, 1 step: a check that it "
                   "runs; RESULTS.md is left alone")
    args = p.parse_args()
    if args.one:
        res = run_one(args.one, args.hidden, args.vocab, args.tokens, args.response, args.reps)
        print(json.dumps(res))
        return
    t_start = time.time()
    load = os.getloadavg()[0]
    big = [256, 1024] if args.quick else [256, 1024, 4096]
    vocabs = [99, 8192] if args.quick else [99, 1024, 4096, 8192, 16384, 32768]
    # (hidden, vocabulary) of table 1; (hidden, tokens, response length) of table 2
    one, two = (256, 151936), (128, 2048, 32)
    if args.smoke:
        big, vocabs, one, two, args.reps = [32], [99], (32, 512), (32, 32, 16), 1
    lines = ["Qwen2-style model, hidden 256, 2 layers, vocabulary 151,936 (Qwen2's):", "", HEADER]
    for n in big:
        lines.append(_row(measure(*one, n, RESPONSE, args.reps)))
        print(lines[-1], flush=True)
    lines += ["", "The embedded default's model (hidden 128, 2 layers) at its per-worker update "
              "size, 2,048 response tokens (8 prompts x 8 samples x 32 tokens), over vocabulary "
              "sizes (the embedded vocabulary is 99):", "",
              HEADER]
    for v in vocabs:
        lines.append(_row(measure(two[0], v, two[1], two[2], args.reps + 2)))
        print(lines[-1], flush=True)
    import torch

    note = (f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on a 2-core CPU, "
            f"torch {torch.__version__}, one torch thread per variant (a trainer worker's), run "
            f"with `nice` while other jobs shared the cores (1-minute load {load:.1f} at the "
            f"start; "
            f"times are medians of {args.reps} steps (table 2: {args.reps + 2}), peaks the max "
            f"RSS delta of a fresh process per variant); {time.time() - t_start:.0f} s in all. "
            f"One step: forward with entropy, GRPO loss, backward.")
    reading = ("The CPU threshold of `model.fused_lm_head=auto` (2^27 tokens x vocabulary, "
               "layout/) is read off these tables: on CPU the fused head buys memory, "
               "not time.")
    body = "\n".join(["", note, "", *lines, "", reading, ""])
    print(body)
    if not (args.quick or args.smoke):
        write_section(os.path.join(HERE, "RESULTS.md"),
                      "## 7. Fused LM head in the update (CPU)\n" + body, "fused-lm-head-cpu")


if __name__ == "__main__":
    main()
