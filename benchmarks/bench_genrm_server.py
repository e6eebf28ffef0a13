"""Loopback load test of the GenRM server (rule:addition backend, started with `launch`):
requests/s and p50/p99 latency at several numbers of concurrent clients.

    python benchmarks/bench_genrm_server.py [--write benchmarks/RESULTS.md] [--requests 2000]
        [--concurrency 1,64,512]
    python benchmarks/bench_genrm_server.py --smoke    # 40 requests at 1 and 8 clients, seconds

Each level sends the same number of compact-template addition requests (a fixed mix of right and
flawed steps, 2 to 5 digits) from one aiohttp client whose connection pool is as large as the
concurrency; client and server share the machine's cores, so this measures the pair.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time

import aiohttp

import checkout  # noqa: F401  (before the package: this checkout's)
import results_md

from reasonrl_fast.genrm.launch import launch
from reasonrl_fast.protocol import parse_verdict, render
from reasonrl_fast.tasks.addition import addition_steps, make_prompt

MARKER = "genrm-server"


def requests(n: int, seed: int = 0) -> list[tuple[dict, int]]:
    """(request body, number of steps): half right work, half with one miswritten column."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        d = rng.randint(2, 5)
        a, b = rng.randint(10 ** (d - 1), 10**d - 1), rng.randint(10 ** (d - 1), 10**d - 1)
        steps, ans = addition_steps(a, b, d, miswrite_at=rng.randrange(d) if i % 2 else None)
        steps = steps.split(",")
        body = {"model": "rule:addition", "temperature": 0, "max_tokens": 512,
                "messages": [{"role": "user", "content": render("compact", make_prompt(a, b), str(ans), steps)}]}
        out.append((body, len(steps)))
    return out


async def level(url: str, reqs: list[tuple[dict, int]], concurrency: int) -> dict:
    """Send every request with `concurrency` clients in flight; latencies and errors."""
    latencies: list[float] = []
    errors = 0
    it = iter(reqs)
    conn = aiohttp.TCPConnector(limit=max(concurrency, 100))
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as s:
        async def client() -> None:
            nonlocal errors
            for body, n_steps in it:
                t = time.perf_counter()
                try:
                    async with s.post(url, json=body) as r:
                        out = await r.json()
                    ok = r.status == 200 and parse_verdict(out["choices"][0]["message"]["content"], n_steps, "compact") is not None
                except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError):
                    ok = False
                latencies.append(time.perf_counter() - t)
                errors += not ok

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    latencies.sort()

    def q(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))]

    return {"concurrency": concurrency, "n": len(latencies), "rps": len(latencies) / wall,
            "p50_ms": 1000 * q(0.50), "p99_ms": 1000 * q(0.99), "errors": errors, "wall_s": wall}


def draw(rows: list[dict], png: str) -> None:
    """Throughput and latency against the number of concurrent clients, beside the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = [r["concurrency"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax1.plot(c, [r["rps"] for r in rows], marker="o")
    ax1.set(xscale="log", xlabel="concurrent clients", ylabel="requests/s", title="throughput")
    ax2.plot(c, [r["p50_ms"] for r in rows], marker="o", label="p50")
    ax2.plot(c, [r["p99_ms"] for r in rows], marker="o", label="p99")
    ax2.set(xscale="log", yscale="log", xlabel="concurrent clients", ylabel="ms", title="latency")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle("GenRM server, rule:addition on loopback")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    print(f"wrote {png}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="requests per concurrency level")
    p.add_argument("--concurrency", default="1,64,512", help="comma-separated levels")
    p.add_argument("--write", metavar="RESULTS.md")
    p.add_argument("--smoke", action="store_true", help="40 requests at 1 and 8 clients: a check that it runs")
    a = p.parse_args()
    if a.smoke:
        a.requests, a.concurrency = 40, "1,8"
    levels = [int(c) for c in a.concurrency.split(",")]
    reqs = requests(a.requests)
    load0 = os.getloadavg()[0]
    rows = []
    with launch("rule:addition") as server:
        url = server.url + "/chat/completions"
        asyncio.run(level(url, reqs[:50], 4))  # warm-up: imports, first connections
        for c in levels:
            rows.append(asyncio.run(level(url, reqs, c)))
            r = rows[-1]
            print(f"concurrency {c}: {r['rps']:.0f} req/s, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
                  f"errors {r['errors']}", flush=True)
    load1 = os.getloadavg()[0]
    lines = ["| concurrent clients | requests | requests/s | p50 latency ms | p99 latency ms | errors |",
             "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['concurrency']} | {r['n']} | {r['rps']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
              f"{r['errors']} |" for r in rows]
    body = "\n".join(lines)
    print(body)
    if a.write:
        head = (f"### GenRM server, rule:addition on loopback ({time.strftime('%Y-%m-%d')}, {os.cpu_count()}-core CPU, "
                f"load {load0:.1f} at the start and {load1:.1f} at the end; "
                f"`python benchmarks/bench_genrm_server.py`)\n\n")
        results_md.write_section(a.write, head + body, MARKER)
        draw(rows, os.path.join(os.path.dirname(os.path.abspath(a.write)), "genrm_server.png"))
    if any(r["errors"] for r in rows):
        sys.exit(f"{sum(r['errors'] for r in rows)} requests failed")


if __name__ == "__main__":
    main()
