"""The CPU table of the ops (`make bench`): every per-op script's cases at its CPU sizes, in one
process, against eager PyTorch and torch.compile of it.

    python benchmarks/bench_ops.py [--quick] [--write benchmarks/RESULTS.md] [--json F] [--png DIR]
                                   [--capabilities default,avx2,avx512]

Sizes: token_logprob N = 4096 x V = 32000 fp32 (forward, with entropy, forward + backward, and
forward + backward of an upstream op's logits); group_advantage B = 8192; tb_loss B x T = 512 x
8192; masked_mean B x T x H = 64 x 2048 x 896. Each row: the median time of repeated calls after
warm-up (compilation included there), and the peak extra resident memory of one call (the
process' peak RSS, reset through /proc/self/clear_refs just before the call, minus the RSS before
it): what the call adds on top of its inputs. Ours runs once per CPU capability this CPU has
(csrc/capability.h: the kernels' loops built for the baseline instruction set, AVX2 + FMA and
AVX-512, each forced around its calls), each row against the same eager and compile rows. The per-op scripts (bench_token_logprob.py, ...)
time the same cases, and the GPU sizes with --device cuda.
"""

from __future__ import annotations

import argparse
import os
import sys

from checkout import HERE
import harness

SCRIPTS = ["bench_token_logprob.py", "bench_group_advantage.py", "bench_tb_loss.py", "bench_masked_mean.py"]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="small shapes, few repeats (a smoke run)")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--providers", default=None, help="comma-separated subset of the providers")
    p.add_argument("--write", metavar="RESULTS.md", help="write the table into this file")
    p.add_argument("--json", metavar="F", help="append the rows to this JSON-lines file")
    p.add_argument("--png", metavar="DIR", help="one PNG per op into this folder")
    p.add_argument("--capabilities", default=None,
                   help="CPU capabilities to run ours at, comma-separated (default: each this CPU has)")
    a = p.parse_args(argv)
    import torch

    from reasonrl_fast import ops

    torch.manual_seed(0)
    reps = a.reps or (3 if a.quick else 7)
    info = harness.env_info(a.device)
    rates = harness.measure_rates(a.device, harness.default_dtype(a.device), quick=a.quick)
    print(f"# {harness.machine_line(info)}  {info['date_utc']}\n# {harness.rates_line(rates)}", flush=True)
    caps = a.capabilities.split(",") if a.capabilities else ops.cpu_capabilities()
    if a.device == "cpu":
        print(f"# ours at CPU capabilities {', '.join(caps)} (this CPU has {', '.join(ops.cpu_capabilities())})")
    rows = []
    for script in SCRIPTS:
        cases = harness.load_script(os.path.join(HERE, script)).cases(a.device, a.quick)
        for c in cases:
            if a.providers:
                c.providers = [x for x in c.providers if x in a.providers.split(",")]
            if a.device == "cpu":
                per_capability(c, caps)
        rows += harness.run_cases(cases, a.device, reps, warmup=1, rates=rates)
    print(harness.markdown_table(rows))
    if a.write:
        cmd = "python benchmarks/bench_ops.py " + " ".join(sys.argv[1:] if argv is None else argv)
        harness.write_markdown(a.write, "ops-cpu", "CPU ops" if a.device == "cpu" else f"ops on {a.device}",
                               rows, rates, info, cmd.strip())
    if a.json:
        harness.write_jsonl(a.json, rows, info, rates)
    if a.png:
        os.makedirs(a.png, exist_ok=True)
        for op in dict.fromkeys(r["op"] for r in rows):
            harness.plot([r for r in rows if r["op"] == op], os.path.join(a.png, f"{op}.png"), op)
    return rows


def per_capability(case: harness.Case, caps: list[str]) -> None:
    """Each of our providers once per CPU capability in `caps` (csrc/capability.h), labelled
    "ours [avx2]", forced around each call; eager and compile as they are."""
    from reasonrl_fast import ops

    make = case.make

    def make_at(provider: str, size: dict, device: str):
        name, _, cap = provider.partition(" [")
        fn = make(name, size, device)
        if not cap:
            return fn
        cap = cap.rstrip("]")

        def call():
            with ops.capability(cap):
                return fn()
        return call

    case.providers = [f"{p} [{c}]" if p.startswith("ours") else p for p in case.providers
                      for c in (caps if p.startswith("ours") else [None])]
    case.notes = {f"{p} [{c}]": n for p, n in case.notes.items() for c in caps} | case.notes
    case.work = {f"{p} [{c}]": w for p, w in case.work.items() for c in caps} | case.work
    case.make = make_at


if __name__ == "__main__":
    main()
