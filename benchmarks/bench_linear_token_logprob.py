"""Benchmark linear_token_logprob against the usual ways of getting per-token log-probs from
an LM head, side by side in one run.

    python benchmarks/bench_linear_token_logprob.py  # GPU: N=16384, H=3584, V=152064, bf16
    python benchmarks/bench_linear_token_logprob.py --device cpu --n 256 --h 896 --v 151936

Variants: ours (reasonrl_fast.ops.linear_token_logprob), eager PyTorch (h @ W.T, float32
log_softmax, gather, entropy), torch.compile of that, and where installed Liger-Kernel's
fused linear cross entropy (LigerFusedLinearCrossEntropyLoss, reduction="none": -lp) and
flash-attn's Triton cross entropy on materialised logits. Each variant computes forward +
backward of sum(lp) (+ entropy where the variant supports it).

Reported per variant: median time, achieved TFLOP/s on the 6 N H V FLOPs that forward +
backward need at least (2 N H V forward, 4 N H V for dh and dW), % of the floor (those FLOPs
at the GEMM throughput measured on the same device, same dtype), and the peak extra memory
(CUDA: max_memory_allocated above the inputs; CPU: each variant runs in a fresh subprocess and
reports its maximum resident set size minus the resident size just before the first step).
The GEMM ceiling is the problem's own [N, H] x [H, V] GEMM (V capped at 32768) timed alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def timeit(fn, dev, reps, warmup=1):
    for _ in range(warmup):
        fn()
    _sync(dev)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def gemm_ceiling(dev, dtype, reps, n, h, v):
    """FLOP/s of the problem's own GEMM, [N, H] x [H, V'] in dtype (V' = min(V, 32768) to
    bound memory): the ceiling against which % of floor is computed."""
    v = min(v, 32768)
    a = torch.randn(n, h, device=dev, dtype=dtype)
    b = torch.randn(h, v, device=dev, dtype=dtype)
    t = timeit(lambda: a @ b, dev, reps, warmup=2)
    return 2 * n * h * v / t


def _rss_now():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_variant(name, h, W, y, ent):
    from reasonrl_fast.ops import linear_token_logprob

    def eager_lp(h, W):
        z = (h @ W.T).float()
        logp = torch.log_softmax(z, -1)
        lp = logp.gather(-1, y[:, None]).squeeze(-1)
        if ent:
            return lp.sum() - (logp.exp() * logp).sum()
        return lp.sum()

    if name == "ours":
        def f(h, W):
            if ent:
                lp, e = linear_token_logprob(h, W, y, return_entropy=True)
                return lp.sum() + e.sum()
            return linear_token_logprob(h, W, y).sum()
        return f
    if name == "eager":
        return eager_lp
    if name == "compile":
        return torch.compile(eager_lp)
    if name == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        loss = LigerFusedLinearCrossEntropyLoss(reduction="sum")
        return lambda h, W: -loss(W, h, y)
    if name == "flash_attn_ce":
        from flash_attn.ops.triton.cross_entropy import cross_entropy_loss

        return lambda h, W: -cross_entropy_loss(h @ W.T, y)[0].sum()
    raise ValueError(name)


def run_one(args, name):
    dev = args.device
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    # Filled in place: no temporary the size of W inflates the CPU peak-RSS baseline.
    h = torch.empty(args.n, args.h, device=dev, dtype=dtype).normal_(0, 0.25).requires_grad_()
    W = torch.empty(args.v, args.h, device=dev, dtype=dtype).normal_(0, args.h**-0.5)
    W.requires_grad_()
    y = torch.randint(0, args.v, (args.n,), device=dev)
    f = make_variant(name, h, W, y, args.entropy)

    def step():
        h.grad = W.grad = None
        f(h, W).backward()

    if dev == "cuda":
        step()
        torch.cuda.synchronize()
        h.grad = W.grad = None
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        rss0 = _rss_now()
        step()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    t = timeit(step, dev, args.reps, warmup=1)
    return {"variant": name, "time_s": t, "peak_extra_bytes": int(peak)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--h", type=int, default=3584)
    p.add_argument("--v", type=int, default=152064)
    p.add_argument("--dtype", default=None)
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--entropy", action="store_true")
    p.add_argument("--variants", default="ours,eager,compile,liger,flash_attn_ce")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help="append results to this JSON-lines file")
    args = p.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.reps = args.reps or (10 if args.device == "cuda" else 3)
    if args.one:
        print(json.dumps(run_one(args, args.one)))
        return
    dtype = getattr(torch, args.dtype)
    ceil = gemm_ceiling(args.device, dtype, args.reps, args.n, args.h, args.v)
    floor_flops = 6 * args.n * args.h * args.v
    card = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} cores visible)"
    print(f"# linear_token_logprob fwd+bwd  {card}  torch {torch.__version__}  "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# N={args.n} H={args.h} V={args.v} {args.dtype} entropy={args.entropy}  "
          f"GEMM ceiling {ceil / 1e12:.3f} TFLOP/s  floor {floor_flops / ceil * 1e3:.1f} ms")
    print(f"{'variant':<16}{'time ms':>10}{'TFLOP/s':>10}{'% floor':>9}{'peak extra MiB':>16}")
    rows = []
    for name in args.variants.split(","):
        cmd = [sys.executable, __file__, "--one", name] + [
            a for k, v in vars(args).items() if k not in ("one", "variants", "json", "entropy")
            for a in (f"--{k}", str(v))] + (["--entropy"] if args.entropy else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{name:<16}  not run: {last[:100]}")
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        t = res["time_s"]
        res.update(tflops=floor_flops / t / 1e12, pct_floor=100 * floor_flops / ceil / t,
                   n=args.n, h=args.h, v=args.v, dtype=args.dtype, device=card)
        rows.append(res)
        print(f"{name:<16}{t * 1e3:>10.1f}{res['tflops']:>10.3f}{res['pct_floor']:>9.1f}"
              f"{res['peak_extra_bytes'] / 2**20:>16.1f}")
    if args.json:
        with open(args.json, "a") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
