"""Gathering a bucket of dim-0 shards on CPU gloo ranks, two ways (not a timed test):

    python benchmarks/bench_transport.py [--world 2] [--mib 8,40] [--repeats 7]

- all_gather: torch.distributed.all_gather_into_tensor, each rank's row of the output as input
  (in place, as NCCL gathers);
- broadcast rows: one broadcast per rank of its row of the output, in place (what
  trainer/fsdp.py `gather_rank_major` does on gloo).

For each bucket size: the median seconds over `--repeats` gathers and rank 0's peak rise of its
resident set over the output buffer it must hold anyway (VmHWM, reset before each gather), in
MiB. glibc returns every freed block of 64 KiB or more at once (MALLOC_MMAP_THRESHOLD_, set for
the ranks), so the peak resident set is the peak of live memory. Prints a markdown table."""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import checkout  # noqa: F401  (before the package: this checkout's)
from harness import peak_memory_mb

MIB = 2**20
METHODS = ("all_gather", "broadcast rows")


def _gather(method: str, out: torch.Tensor, rank: int, world: int) -> None:
    rows = out.view(world, -1)
    if method == "all_gather":
        dist.all_gather_into_tensor(out, rows[rank])
    else:
        for k in range(world):
            dist.broadcast(rows[k], src=k)


def _rank(rank: int, world: int, port: int, sizes: list[int], repeats: int, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = []
    for mib in sizes:
        n = mib * MIB // 2 // world * world  # bf16, the engine's dtype
        for method in METHODS:
            times, peaks = [], []
            for _ in range(repeats):
                out = torch.full((n,), float(rank), dtype=torch.bfloat16)  # the buffer itself, touched
                dist.barrier()

                def gather():
                    t0 = time.perf_counter()
                    _gather(method, out, rank, world)
                    times.append(time.perf_counter() - t0)

                peaks.append(peak_memory_mb(gather, "cpu"))  # beyond what was resident before: the buffer's
                assert torch.equal(out.view(world, -1)[:, 0], torch.arange(world, dtype=torch.bfloat16))
                del out
            rows.append((mib, method, statistics.median(times), max(peaks)))
    if rank == 0:
        results.extend(rows)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--mib", default="8,40", help="bucket sizes in MiB, comma-separated")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by each spawned rank's malloc at its start
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().list()
    mp.spawn(_rank, args=(args.world, port, [int(x) for x in args.mib.split(",")], args.repeats, results),
             nprocs=args.world)
    print(f"{args.world} gloo ranks, 1 thread each, bf16 buckets, median of {args.repeats}; "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    print("| bucket (MiB) | gather | median (ms) | rank 0 peak beyond the bucket (MiB) |")
    print("|---:|---|---:|---:|")
    for mib, method, t, peak in results:
        print(f"| {mib} | {method} | {t * 1e3:.1f} | {peak:.1f} |")


if __name__ == "__main__":
    main()
