"""The cost of checkpoint checksums (not a timed test).

    python benchmarks/bench_checkpoint.py [--write benchmarks/RESULTS.md] [--repeats 5]
    python benchmarks/bench_checkpoint.py --smoke     # one save each, a 10 MiB synthetic one: seconds

A save is what the workers write (torch.distributed.checkpoint shards of the model and the AdamW
state, one RNG file) and then the driver's finalize, which now reads every file back and records
its CRC-32 (checkpoint.checksums, right after the write: from the page cache). Resume, merge and
eval check the same checksums (checkpoint.defects) before loading. Two checkpoints, each saved
`--repeats` times into a fresh folder (medians):

1. the default run's: the embedded tiny Qwen2 of `python -m reasonrl_fast.train` with its Z-head
   and AdamW states, in one process (the run's two replicated ranks write the same bytes once);
2. a larger synthetic one: 1 GiB of float32 tensors in two shards, as two ranks write them.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

import checkout  # noqa: F401  (before the package: this checkout's)
from reasonrl_fast.runtime import checkpoint as ckpt

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def default_run_state() -> dict:
    """The default run's model (tiny Qwen2 + Z-head) and AdamW state after one step."""
    from reasonrl_fast.models.tiny import char_tokenizer, tiny_model
    from reasonrl_fast.ops import ZHead
    from reasonrl_fast.config import load_config

    cfg = load_config(None, [])
    tok = char_tokenizer()
    lm = tiny_model(cfg.model, len(tok), tok)
    model = torch.nn.ModuleDict({"lm": lm, "proj_z": ZHead(cfg.model.hidden_size)})
    opt = torch.optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    optim = {f"{i}.{k}": v for i, s in opt.state_dict()["state"].items() for k, v in s.items() if v.dim()}
    return {"model": model.state_dict(), "optim": optim}


def synthetic_state(gib: float = 1.0, tensors: int = 8) -> list[dict]:
    """Two ranks' shards: `gib` GiB of float32 in all."""
    n = int(gib * 2**30 / 4 / tensors)
    return [{f"t{r}_{i}": torch.randn(n) for i in range(tensors // 2)} for r in range(2)]


def save_once(states: list[dict], out: str) -> dict[str, float]:
    tmp = ckpt.tmp_path(out, 1)
    t0 = time.perf_counter()
    for r, st in enumerate(states):  # each rank's shard file, as DCP names them
        torch.save(st, os.path.join(tmp, f"__{r}_0.distcp")) if len(states) > 1 else \
            dcp.save(st, checkpoint_id=tmp, no_dist=True)
    if len(states) > 1:
        with open(os.path.join(tmp, ".metadata"), "wb") as f:
            f.write(os.urandom(4096))
    for r in range(len(states)):
        ckpt.save_rng(tmp, r, _sched())
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sums = ckpt.checksums(tmp)
    checksum_s = time.perf_counter() - t0
    size = sum(s for s, _ in sums.values())
    # finalize without the checksums it computes again: publish what was measured
    path = ckpt.finalize(tmp, ckpt.TrainState(1, "bench", len(states), {"epoch": 0, "pos": 0}, random.getstate()),
                         _Saver(), _Saver(), 0)
    t0 = time.perf_counter()
    assert ckpt.defects(path) == []
    verify_s = time.perf_counter() - t0
    shutil.rmtree(path)
    return {"write_s": write_s, "checksum_s": checksum_s, "verify_s": verify_s, "bytes": size}


class _Saver:
    def save_pretrained(self, d):
        os.makedirs(d, exist_ok=True)


def _sched():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(1))])
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def measure(states: list[dict], repeats: int) -> dict:
    out = tempfile.mkdtemp(prefix="bench_ckpt_")
    try:
        rows = [save_once(states, out) for _ in range(repeats)]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return med


def table(results: dict[str, dict], repeats: int) -> str:
    lines = ["| checkpoint | size | write (workers) | CRC-32 at save | share of the save | check on load | CRC rate |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, m in results.items():
        mb = m["bytes"] / 2**20
        share = m["checksum_s"] / (m["write_s"] + m["checksum_s"])
        lines.append(f"| {name} | {mb:,.1f} MiB | {m['write_s'] * 1e3:,.1f} ms | {m['checksum_s'] * 1e3:,.1f} ms | "
                     f"{share:.0%} | {m['verify_s'] * 1e3:,.1f} ms | {mb / 1024 / m['checksum_s']:.2f} GiB/s |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", metavar="RESULTS.md")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--gib", type=float, default=1.0, help="size of the synthetic checkpoint")
    p.add_argument("--smoke", action="store_true", help="one save of each, 10 MiB synthetic: a check that it runs")
    a = p.parse_args()
    if a.smoke:
        a.repeats, a.gib = 1, 0.01
    torch.set_num_threads(1)
    results = {"default run (tiny Qwen2 + Z-head + AdamW)": measure([default_run_state()], a.repeats),
               "synthetic, 2 shards": measure(synthetic_state(a.gib), a.repeats)}
    load = os.getloadavg()[0]
    head = (f"### Checkpoint checksums ({time.strftime('%Y-%m-%d')}, CPU, {os.cpu_count()} cores, "
            f"load {load:.1f} at the end, {platform.python_implementation()} {platform.python_version()}; "
            f"`python benchmarks/bench_checkpoint.py`, median of {a.repeats} saves)\n\n")
    body = head + table(results, a.repeats)
    print(body)
    if a.write:
        from results_md import write_section

        write_section(a.write, body, "checkpoint-checksums")


if __name__ == "__main__":
    main()
