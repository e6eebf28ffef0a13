"""Time and memory of every op on CPU against plain PyTorch eager and torch.compile of it.

    python benchmarks/bench_ops.py [--quick] [--write benchmarks/RESULTS.md]

Each row: median wall time over repeated runs (after warm-up and compilation), and peak extra
resident memory of one call (the process' peak RSS, reset through /proc/self/clear_refs just
before the call, minus the RSS before it): what the call adds on top of its inputs.
All providers of one op run in this process, one after the other, on the same inputs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import statistics
import time

import torch

from reasonrl_fast.ops import group_advantage, masked_mean, tb_loss, token_logprob
from reasonrl_fast.ops import reference as ref

MiB = 2**20


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def peak_extra_mib(fn) -> float:
    """Peak RSS growth during one call of fn (Linux)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = _rss_kb("VmRSS")
    fn()
    return (_rss_kb("VmHWM") - before) / 1024


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


# --- plain PyTorch versions of each op (the baselines), written as a trainer would ---------

def eager_logprob(logits, ids, temperature=1.0):
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def eager_logprob_entropy(logits, ids, temperature=1.0):
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1), ent


def fwd_bwd(f):
    def run(x, *rest):
        out = f(x, *rest)
        out = out if isinstance(out, torch.Tensor) else sum(o.sum() for o in out)
        out.sum().backward()
        x.grad = None
    return run


def bench_token_logprob(n, v, repeats):
    x = torch.randn(n, v)
    ids = torch.randint(0, v, (n,))
    xg = x.clone().requires_grad_()
    rows = []
    cases = {
        "forward": {
            "reasonrl_fast": lambda: token_logprob(x, ids),
            "eager": lambda: eager_logprob(x, ids),
            "torch.compile": (torch.compile(eager_logprob), lambda f: f(x, ids)),
        },
        "forward + entropy": {
            "reasonrl_fast": lambda: token_logprob(x, ids, return_entropy=True),
            "eager": lambda: eager_logprob_entropy(x, ids),
            "torch.compile": (torch.compile(eager_logprob_entropy), lambda f: f(x, ids)),
        },
        "forward + backward": {
            "reasonrl_fast": lambda: fwd_bwd(token_logprob)(xg, ids),
            "eager": lambda: fwd_bwd(eager_logprob)(xg, ids),
            "torch.compile": (torch.compile(eager_logprob), lambda f: fwd_bwd(f)(xg, ids)),
        },
        # The logits as an upstream op's output (an LM head's), which is where
        # inplace_backward can hand their storage back as the gradient.
        "fwd + bwd, non-leaf logits": {
            "reasonrl_fast": lambda: fwd_bwd(lambda a, b: token_logprob(a * 1.0, b))(xg, ids),
            "reasonrl_fast (inplace_backward)": lambda: fwd_bwd(
                lambda a, b: token_logprob(a * 1.0, b, inplace_backward=True)
            )(xg, ids),
            "eager": lambda: fwd_bwd(lambda a, b: eager_logprob(a * 1.0, b))(xg, ids),
        },
    }
    size = f"N={n}, V={v}, fp32 (logits {x.numel() * 4 / MiB:.0f} MiB)"
    for case, providers in cases.items():
        rows += _run_providers("token_logprob", case, size, providers, repeats)
    return rows


def _run_providers(op, case, size, providers, repeats):
    rows = []
    for name, fn in providers.items():
        if isinstance(fn, tuple):  # (compiled function, how to call it)
            compiled, call = fn
            fn = (lambda c, k: (lambda: k(c)))(compiled, call)
        fn()  # warm-up (and compilation)
        ms = median_ms(fn, repeats)
        mem = peak_extra_mib(fn)
        rows.append(dict(op=op, case=case, size=size, provider=name, ms=ms, mib=mem))
        print(f"{op:16s} {case:22s} {name:34s} {ms:10.2f} ms {mem:9.1f} MiB", flush=True)
    base = {r["provider"]: r["ms"] for r in rows}
    for r in rows:
        r["vs_eager"] = base["eager"] / r["ms"] if "eager" in base else None
        r["vs_compile"] = base["torch.compile"] / r["ms"] if "torch.compile" in base else None
    return rows


def bench_group_advantage(b, repeats):
    r = torch.randn(b)
    ids = torch.randperm(b) // 8  # groups of 8, scattered over the batch
    providers = {
        "reasonrl_fast": lambda: group_advantage(r, ids),
        "eager": lambda: ref.group_advantage(r, ids),  # verl's loop over groups
    }
    return _run_providers("group_advantage", "forward", f"B={b}, groups of 8", providers, repeats)


def bench_tb_loss(b, t, repeats):
    log_z = torch.randn(b, requires_grad=True)
    lp = (-torch.rand(b, t)).requires_grad_()
    ref_lp, old = -torch.rand(b, t), lp.detach() + 0.01 * torch.randn(b, t)
    reward = torch.randn(b)
    mask = (torch.arange(t)[None] < torch.randint(1, t, (b, 1))).float()

    def eager(z, l):
        return ref.tb_loss(z, l, ref_lp, old, reward, mask)[0]

    def step(f):
        def run():
            f(log_z, lp).backward()
            log_z.grad = lp.grad = None
        return run

    compiled = torch.compile(eager)
    providers = {
        "reasonrl_fast": step(lambda z, l: tb_loss(z, l, ref_lp, old, reward, mask)),
        "eager": step(eager),
        "torch.compile": step(compiled),
    }
    return _run_providers("tb_loss", "forward + backward", f"B={b}, T={t}, fp32", providers, repeats)


def bench_masked_mean(b, t, h, repeats):
    x = torch.randn(b, t, h, requires_grad=True)
    mask = torch.arange(t)[None] < torch.randint(1, t, (b, 1))

    def step(f):
        def run():
            f(x, mask).sum().backward()
            x.grad = None
        return run

    providers = {
        "reasonrl_fast": step(masked_mean),
        "eager": step(ref.masked_mean),
        "torch.compile": step(torch.compile(ref.masked_mean)),
    }
    return _run_providers("masked_mean", "forward + backward", f"B={b}, T={t}, H={h}, fp32", providers, repeats)


def machine() -> str:
    cpu = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = re.search(r"model name\s*:\s*(.*)", f.read()).group(1)
    except (OSError, AttributeError):
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"


def to_markdown(rows) -> str:
    lines = [
        "| op | case | size | provider | median ms | speed-up vs eager | vs torch.compile | peak extra MiB |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        ve = f"{r['vs_eager']:.2f}x" if r["vs_eager"] else ""
        vc = f"{r['vs_compile']:.2f}x" if r["vs_compile"] else ""
        lines.append(
            f"| {r['op']} | {r['case']} | {r['size']} | {r['provider']} | {r['ms']:.2f} | {ve} | {vc} | {r['mib']:.1f} |"
        )
    return "\n".join(lines)


def write_section(path, body, marker="ops-cpu"):
    from results_md import write_section as write

    write(path, body, marker)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small shapes, few repeats (a smoke run)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--write", metavar="RESULTS.md", help="write the table into this file")
    a = p.parse_args()
    torch.manual_seed(0)
    if a.quick:
        n, v, b, t, rep = 256, 4000, 512, 256, 3
    else:
        n, v, b, t, rep = 4096, 32000, 512, 8192, a.repeats
    rows = bench_token_logprob(n, v, rep)
    rows += bench_group_advantage(8192, rep)
    rows += bench_tb_loss(b, t, rep)
    rows += bench_masked_mean(64, 2048 if not a.quick else 128, 896, rep)
    md = to_markdown(rows)
    print(md)
    if a.write:
        head = (
            f"### CPU ops ({datetime.date.today().isoformat()}, {machine()})\n\n"
            f"`python benchmarks/bench_ops.py --write {a.write}`; median of {rep} runs after warm-up; "
            "speed-up = baseline time / this time; peak extra = peak RSS growth during one call.\n"
        )
        write_section(a.write, head + "\n" + md)


if __name__ == "__main__":
    main()
