"""Benchmarks of the four custom ops against plain PyTorch at the target GPU shapes (H100, bf16).

    python benchmarks/bench_gpu_ops.py                       # CUDA, the target shapes below
    python benchmarks/bench_gpu_ops.py --device cpu --scale 0.03125   # CPU, N = 512

- token_logprob at N x V (default 16384 x 152064, bf16): forward, and forward+backward;
  achieved GB/s on the bytes that must move at least (forward: read N V logits once;
  forward+backward: read them twice and write the gradient once) and % of the copy bandwidth
  measured on the same device (a large tensor copy: read + write), next to eager PyTorch
  (float32 log_softmax + gather) and torch.compile of it (--no-compile to skip).
- group_advantage at B = 8192 (groups of 8): one op call against verl's
  Python loop over groups (reasonrl_fast.ops.reference.group_advantage).
- tb_loss forward+backward at B x T = 512 x 8192 against eager PyTorch (the reference).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from reasonrl_fast.ops import group_advantage, tb_loss, token_logprob  # noqa: E402
from reasonrl_fast.ops import reference as R  # noqa: E402


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def timeit(fn, dev, reps, warmup=1):
    for _ in range(warmup):
        fn()
    sync(dev)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def copy_bandwidth(dev, reps):
    n = (1 << 30) if dev == "cuda" else (1 << 27)  # bytes
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    t = timeit(lambda: b.copy_(a), dev, reps, warmup=2)
    return 2 * n / t  # read + write


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies token_logprob's N")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()
    dev = args.device
    reps = args.reps or (20 if dev == "cuda" else 3)
    card = torch.cuda.get_device_name() if dev == "cuda" else f"CPU ({os.cpu_count()} cores visible)"
    print(f"# {card}  torch {torch.__version__}  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    bw = copy_bandwidth(dev, reps)
    print(f"# copy bandwidth (read+write) {bw / 1e9:.1f} GB/s")

    # token_logprob
    N, V = max(1, int(16384 * args.scale)), 152064
    dtype = torch.bfloat16
    z = torch.randn(N, V, device=dev, dtype=dtype)
    y = torch.randint(0, V, (N,), device=dev)
    fwd_bytes = N * V * z.element_size()

    def eager(z):
        return torch.log_softmax(z.float(), -1).gather(-1, y[:, None]).squeeze(-1)

    variants = [("ours", lambda z: token_logprob(z, y)), ("eager", eager)]
    if not args.no_compile:
        variants.append(("compile", torch.compile(eager)))
    print(f"\ntoken_logprob N={N} V={V} bf16")
    print(f"{'variant':<10}{'fwd ms':>9}{'GB/s':>8}{'% bw':>7}{'fwd+bwd ms':>12}{'GB/s':>8}{'% bw':>7}")
    for name, f in variants:
        t_f = timeit(lambda: f(z), dev, reps)
        zg = z.detach().requires_grad_()

        def fb():
            zg.grad = None
            f(zg).sum().backward()

        try:
            t_fb = timeit(fb, dev, reps)
        except RuntimeError as e:  # e.g. out of memory for the eager path
            t_fb = float("nan")
            print(f"  {name}: backward failed: {str(e)[:80]}")
        g_f = fwd_bytes / t_f
        g_fb = 3 * fwd_bytes / t_fb
        print(f"{name:<10}{t_f * 1e3:>9.2f}{g_f / 1e9:>8.1f}{100 * g_f / bw:>7.1f}"
              f"{t_fb * 1e3:>12.2f}{g_fb / 1e9:>8.1f}{100 * g_fb / bw:>7.1f}")
    del z

    # group_advantage
    B = 8192
    r = torch.randn(B, device=dev)
    g = torch.arange(B, device=dev) // 8
    g = g[torch.randperm(B, device=dev)]
    t_ours = timeit(lambda: group_advantage(r, g), dev, reps)
    t_loop = timeit(lambda: R.group_advantage(r, g), dev, max(1, reps // 5))
    print(f"\ngroup_advantage B={B} (groups of 8, shuffled): ours {t_ours * 1e6:.1f} us, "
          f"Python loop {t_loop * 1e3:.1f} ms, speed-up {t_loop / t_ours:.0f}x")

    # tb_loss
    Bt, T = 512, 8192
    mk = lambda *s: torch.randn(*s, device=dev) * 0.01 - 1  # noqa: E731
    lz, lp, ref, old, rw = mk(Bt), mk(Bt, T), mk(Bt, T), mk(Bt, T), mk(Bt)
    mask = torch.rand(Bt, T, device=dev) < 0.8

    def ours_tb():
        a, b = lz.detach().requires_grad_(), lp.detach().requires_grad_()
        tb_loss(a, b, ref, old, rw, mask).backward()

    def eager_tb():
        a, b = lz.detach().requires_grad_(), lp.detach().requires_grad_()
        R.tb_loss(a, b, ref, old, rw, mask)[0].backward()

    t_o = timeit(ours_tb, dev, reps)
    t_e = timeit(eager_tb, dev, reps)
    print(f"\ntb_loss fwd+bwd B={Bt} T={T} fp32: ours {t_o * 1e3:.2f} ms, eager {t_e * 1e3:.2f} ms, "
          f"speed-up {t_e / t_o:.1f}x")


if __name__ == "__main__":
    main()
