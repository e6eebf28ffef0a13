"""The one timing and reporting harness of the op benchmarks.

A per-op script describes its work as `Case`s (an op, a case such as "forward + backward", the
sizes to sweep, the providers to compare and how to build one call) and hands them to
`run_cases`, which times every provider at every size on the same inputs and returns rows:

    {"op", "case", "provider", "size": {...}, "dtype", "status", "ms", "peak_mb",
     "gbps", "pct_copy_bw", "tflops", "pct_matmul", "vs_eager", "vs_compile"}

- time: the median of `reps` calls after `warmup` calls (compilation included in the warm-up);
  CUDA calls are timed with CUDA events around each call, CPU calls with perf_counter.
- peak memory: what one call allocates above what existed before it (its inputs included in
  "before"). CUDA: max_memory_allocated after reset_peak_memory_stats, minus memory_allocated
  before the call. CPU: the growth of the process' peak resident set (VmHWM, reset through
  /proc/self/clear_refs just before the call), after garbage is collected and the C
  allocator's free pages are handed back (malloc_trim), so memory it kept from an earlier call
  and reuses still counts. With `isolate`, each provider runs in a fresh subprocess, so no
  allocator cache or compiled code of another provider is in the count.
- a provider whose package is missing (ImportError) is recorded as "not installed", one that
  fails (out of memory, a kernel error) as "failed: ...": the sweep goes on.
- rates: `copy_bandwidth` (read + write of a large copy) and `matmul_rate` are measured in the
  same run, so a row with the bytes its op must move carries GB/s and % of the copy bandwidth,
  and a row with the FLOPs its op needs carries TFLOP/s and % of the matmul rate.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

import checkout  # noqa: F401  (before the package: this checkout's)
from results_md import write_section

MB = 2**20


@dataclass
class Case:
    """One op and case, swept over `sizes` for each of `providers`.

    make(provider, size, device) builds the inputs once and returns the call to time (it raises
    ImportError when the provider's package is missing). bytes_moved(size) and flops(size), when
    given, are the least bytes the call must move and the FLOPs it must do: they give the rows'
    GB/s and TFLOP/s. work[provider](size), when given, is the FLOPs that provider executes
    (its rows' exec TFLOP/s). dtype names the precision for the table.
    """

    op: str
    case: str
    sizes: list[dict]
    providers: list[str]
    make: Callable[[str, dict, str], Callable[[], Any]]
    dtype: str = "float32"
    bytes_moved: Optional[Callable[[dict], float]] = None
    flops: Optional[Callable[[dict], float]] = None
    notes: dict[str, str] = field(default_factory=dict)  # provider -> what differs in its work
    # provider -> the FLOPs it really executes (a recompute in the backward, rows it does not
    # skip): "exec TFLOP/s" beside the TFLOP/s of the least work `flops`
    work: dict[str, Callable[[dict], float]] = field(default_factory=dict)


# --- timing ------------------------------------------------------------------------------------

def sync(device: str) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def measure(fn: Callable[[], Any], device: str, reps: int = 10, warmup: int = 2) -> float:
    """Median seconds of one call of fn over `reps` calls, after `warmup` untimed calls."""
    if reps < 1:
        raise ValueError(f"measure: reps must be >= 1, got {reps}")
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    if str(device).startswith("cuda"):
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _proc_status_kb(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field_name}")


def peak_memory_mb(fn: Callable[[], Any], device: str) -> Optional[float]:
    """MB that one call of fn adds at its peak on top of what was allocated before it (inputs
    included there). None where the platform cannot tell (CPU without /proc/self/clear_refs)."""
    # Garbage left by earlier code is freed first, and no collection runs inside the call: a
    # collection there would free unrelated memory and hide what the call itself allocates.
    gc.collect()
    with _gc_paused():
        return _peak_memory_mb(fn, device)


@contextlib.contextmanager
def _gc_paused():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _peak_memory_mb(fn: Callable[[], Any], device: str) -> Optional[float]:
    if str(device).startswith("cuda"):
        sync(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        sync(device)
        return (torch.cuda.max_memory_allocated() - base) / MB
    _malloc_trim()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident set (VmHWM) to the current one
        before = _proc_status_kb("VmRSS")
    except OSError:
        return None
    fn()
    return (_proc_status_kb("VmHWM") - before) * 1024 / MB


def _malloc_trim() -> None:
    """Hand the C allocator's free pages back to the system (glibc), so that what the call
    allocates faults in fresh pages and shows in the resident set. Pages it kept from earlier
    calls would be reused unseen: a 64 MB tensor read 0 MB once anything in the process had
    raised the allocator's mmap threshold above its size."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def copy_bandwidth(device: str, nbytes: Optional[int] = None, reps: int = 10) -> float:
    """Bytes/s read + written by a large device-to-device copy (1 GiB on CUDA, 128 MiB on CPU)."""
    n = nbytes or ((1 << 30) if str(device).startswith("cuda") else (1 << 27))
    a = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    b = torch.empty_like(a)
    t = measure(lambda: b.copy_(a), device, reps=reps, warmup=2)
    return 2 * n / t


def matmul_rate(device: str, dtype: torch.dtype = torch.bfloat16, n: Optional[int] = None,
                reps: int = 10) -> float:
    """FLOP/s of an n x n x n matmul in dtype (n = 8192 on CUDA, 512 on CPU)."""
    n = n or (8192 if str(device).startswith("cuda") else 512)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = measure(lambda: a @ b, device, reps=reps, warmup=2)
    return 2 * n**3 / t


# --- environment -------------------------------------------------------------------------------

def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
        if m:
            return m.group(1).strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def env_info(device: str = "cpu") -> dict:
    """The machine and software a result was measured on."""
    info = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": None,
        "card": None,
        "driver": None,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    if str(device).startswith("cuda") and torch.cuda.is_available():
        info["card"] = torch.cuda.get_device_name()
        cap = torch.cuda.get_device_capability()
        info["capability"] = f"{cap[0]}.{cap[1]}"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20,
            ).stdout.strip().splitlines()
            if out:
                name, _, driver = out[0].rpartition(",")
                info["driver"] = driver.strip()
                info["card"] = info["card"] or name.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def machine_line(info: dict) -> str:
    """One line naming the machine of `info` for a table's heading."""
    if info.get("card"):
        return (f"{info['card']}, driver {info.get('driver') or '?'}, CUDA {info.get('cuda')}, "
                f"torch {info['torch']}, triton {info.get('triton') or '-'}")
    return f"{info['cpu']}, {info['cpu_count']} cores, torch {info['torch']}, {info['threads']} threads"


# --- the sweep ---------------------------------------------------------------------------------

def _failure(exc: BaseException) -> str:
    if isinstance(exc, ImportError):
        return f"not installed ({getattr(exc, 'name', None) or str(exc)[:60]})"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text.lower():
        return "failed: out of memory"
    return f"failed: {type(exc).__name__}: {text[:100]}"


def _free(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


def measure_one(case: Case, provider: str, size: dict, device: str, reps: int, warmup: int) -> dict:
    """Time and peak memory of one provider at one size; a failure is recorded in "status"."""
    row = {"op": case.op, "case": case.case, "provider": provider, "size": dict(size),
           "dtype": case.dtype, "device": device, "status": "ok", "ms": None, "peak_mb": None}
    if provider in case.notes:
        row["note"] = case.notes[provider]
    fn = None
    try:
        fn = case.make(provider, size, device)
        row["ms"] = measure(fn, device, reps=reps, warmup=warmup) * 1e3
        row["peak_mb"] = peak_memory_mb(fn, device)
    except Exception as exc:  # noqa: BLE001 (every failure of a provider is a result, not a stop)
        row["status"] = _failure(exc)
    finally:
        del fn
        _free(device)
    return row


def _measure_isolated(script: str, case: Case, provider: str, device: str, reps: int,
                      warmup: int, quick: bool, timeout: float) -> list[dict]:
    """Every size of one provider in a fresh Python process (see `child_main`)."""
    spec = {"script": script, "op": case.op, "case": case.case, "provider": provider,
            "device": device, "reps": reps, "warmup": warmup, "quick": quick}
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                           capture_output=True, text=True, timeout=timeout)
        rows = [json.loads(line[len("ROW "):]) for line in r.stdout.splitlines() if line.startswith("ROW ")]
        if r.returncode != 0 and len(rows) < len(case.sizes):
            last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
            status = "failed: out of memory" if r.returncode in (-9, 137) else f"failed: {last[:100]}"
            done = {json.dumps(x["size"], sort_keys=True) for x in rows}
            rows += [dict(op=case.op, case=case.case, provider=provider, size=s, dtype=case.dtype,
                          device=device, status=status, ms=None, peak_mb=None)
                     for s in case.sizes if json.dumps(s, sort_keys=True) not in done]
        return rows
    except subprocess.TimeoutExpired:
        return [dict(op=case.op, case=case.case, provider=provider, size=s, dtype=case.dtype,
                     device=device, status=f"failed: over {timeout:.0f} s", ms=None, peak_mb=None)
                for s in case.sizes]


def run_cases(cases: list[Case], device: str, reps: int, warmup: int = 2, *,
              isolate_script: Optional[str] = None, quick: bool = False,
              rates: Optional[dict] = None, timeout: float = 600.0, log: bool = True,
              on_case: Optional[Callable[[list[dict]], None]] = None) -> list[dict]:
    """Run every provider of every case at every size; returns the rows with their rates.

    isolate_script: the per-op script's path; when given, each provider runs in a fresh process
    (which imports that script and builds the same cases with `quick`). on_case gets each
    case's rows as soon as they are complete (a run stopped later still leaves them)."""
    rows = []
    for case in cases:
        case_rows = []
        for provider in case.providers:
            if isolate_script:
                got = _measure_isolated(isolate_script, case, provider, device, reps, warmup, quick, timeout)
            else:
                got = [measure_one(case, provider, s, device, reps, warmup) for s in case.sizes]
            for r in got:
                if log:
                    print(format_row(r), flush=True)
            case_rows += got
        add_rates(case_rows, case, rates or {})
        if on_case:
            on_case(case_rows)
        rows += case_rows
    return rows


def add_rates(rows: list[dict], case: Case, rates: dict) -> None:
    """Fill GB/s, % of copy bandwidth, TFLOP/s, % of matmul rate and speed-ups in place."""
    by_size: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["ms"]:
            by_size.setdefault(json.dumps(r["size"], sort_keys=True), {})[r["provider"]] = r["ms"]
    for r in rows:
        for k in ("gbps", "pct_copy_bw", "tflops", "pct_matmul", "exec_tflops", "vs_eager", "vs_compile"):
            r.setdefault(k, None)
        if not r["ms"]:
            continue
        s = r["ms"] / 1e3
        if case.bytes_moved:
            r["gbps"] = case.bytes_moved(r["size"]) / s / 1e9
            if rates.get("copy_gbps"):
                r["pct_copy_bw"] = 100 * r["gbps"] / rates["copy_gbps"]
        if case.flops:
            r["tflops"] = case.flops(r["size"]) / s / 1e12
            if rates.get("matmul_tflops"):
                r["pct_matmul"] = 100 * r["tflops"] / rates["matmul_tflops"]
        if r["provider"] in case.work:
            r["exec_tflops"] = case.work[r["provider"]](r["size"]) / s / 1e12
        base = by_size.get(json.dumps(r["size"], sort_keys=True), {})
        if "eager" in base:
            r["vs_eager"] = base["eager"] / r["ms"]
        if "compile" in base:
            r["vs_compile"] = base["compile"] / r["ms"]


def measure_rates(device: str, matmul_dtype: torch.dtype, quick: bool = False) -> dict:
    """The run's copy bandwidth (GB/s) and matmul rate (TFLOP/s), for the rows' percentages
    (quick on CPU: smaller and fewer calls, a rough figure for a smoke run)."""
    small = quick and not str(device).startswith("cuda")
    reps = 3 if small else 10
    return {"copy_gbps": copy_bandwidth(device, (1 << 24) if small else None, reps=reps) / 1e9,
            "matmul_tflops": matmul_rate(device, matmul_dtype, 256 if small else None, reps=reps) / 1e12,
            "matmul_dtype": str(matmul_dtype).replace("torch.", "")}


# --- output ------------------------------------------------------------------------------------

def size_label(size: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in size.items())


def _f(x: Optional[float], fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def _times(x: Optional[float]) -> str:
    """A speed-up: 2 decimals, none from 100x on."""
    return "" if x is None else (f"{x:.0f}x" if x >= 100 else f"{x:.2f}x")


def format_row(r: dict) -> str:
    """One progress line for a row."""
    if r["status"] != "ok":
        return f"{r['op']:<22}{r['case']:<30} {r['provider']:<22}{size_label(r['size']):<30} {r['status']}"
    mem = "" if r.get("peak_mb") is None else f"{r['peak_mb']:9.1f} MB"
    return f"{r['op']:<22}{r['case']:<30} {r['provider']:<22}{size_label(r['size']):<30}{r['ms']:10.3f} ms {mem}"


def markdown_table(rows: list[dict]) -> str:
    """Rows as one markdown table; columns without any value are left out."""
    cols = [("op", "op", lambda r: r["op"]), ("case", "case", lambda r: r["case"]),
            ("size", "size", lambda r: f"{size_label(r['size'])}, {r['dtype']}"),
            ("provider", "provider", lambda r: r["provider"] + (f" ({r['note']})" if r.get("note") else "")),
            ("ms", "median ms", lambda r: _f(r["ms"], ".3f") if r["status"] == "ok" else r["status"]),
            ("vs_eager", "vs eager", lambda r: _times(r.get("vs_eager"))),
            ("vs_compile", "vs compile", lambda r: _times(r.get("vs_compile"))),
            ("gbps", "GB/s", lambda r: _f(r.get("gbps"), ".1f")),
            ("pct_copy_bw", "% copy bw", lambda r: _f(r.get("pct_copy_bw"), ".1f")),
            ("tflops", "TFLOP/s", lambda r: _f(r.get("tflops"), ".2f")),
            ("pct_matmul", "% matmul", lambda r: _f(r.get("pct_matmul"), ".1f")),
            ("exec_tflops", "exec TFLOP/s", lambda r: _f(r.get("exec_tflops"), ".2f")),
            ("peak_mb", "peak MB", lambda r: _f(r.get("peak_mb"), ".1f"))]
    always = {"op", "case", "size", "provider", "ms"}
    used = [c for c in cols if c[0] in always or any(r.get(c[0]) is not None for r in rows)]
    right = {"ms", "vs_eager", "vs_compile", "gbps", "pct_copy_bw", "tflops", "pct_matmul", "exec_tflops", "peak_mb"}
    lines = ["| " + " | ".join(c[1] for c in used) + " |",
             "|" + "|".join("---:" if c[0] in right else "---" for c in used) + "|"]
    lines += ["| " + " | ".join(c[2](r) for c in used) + " |" for r in rows]
    return "\n".join(lines)


def rates_line(rates: dict) -> str:
    if not rates:
        return ""
    return (f"Measured in the same run: copy bandwidth {rates['copy_gbps']:.1f} GB/s (read + write), "
            f"{rates['matmul_dtype']} matmul {rates['matmul_tflops']:.3g} TFLOP/s.")


def write_markdown(path: str, marker: str, heading: str, rows: list[dict], rates: dict,
                   info: dict, command: str) -> None:
    """Put the rows' table, under a heading naming the machine, into `path` between the markers
    `marker` (other sections of the file are left as they are)."""
    body = (f"### {heading} ({info['date_utc']}, {machine_line(info)})\n\n"
            f"`{command}`; median of repeated calls after warm-up; vs eager = eager's time / this "
            f"time; peak MB = what one call allocates above its inputs. {rates_line(rates)}\n\n"
            + markdown_table(rows))
    write_section(path, body, marker)


def write_jsonl(path: str, rows: list[dict], info: dict, rates: dict) -> None:
    """Append one "env" line (machine and rates) and one line per row to `path`."""
    with open(path, "a") as f:
        f.write(json.dumps({"kind": "env", **info, **rates}) + "\n")
        for r in rows:
            f.write(json.dumps({"kind": "row", **r}) + "\n")


def append_rows(path: str, rows: list[dict]) -> None:
    """Append rows to a file that write_jsonl started."""
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps({"kind": "row", **r}) + "\n")


def read_jsonl(path: str) -> tuple[list[dict], list[dict]]:
    """(env lines, rows) of a file written by write_jsonl."""
    envs, rows = [], []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not a JSON line ({e})") from None
            (envs if d.get("kind") == "env" else rows).append(d)
    return envs, rows


def plot(rows: list[dict], path: str, title: str = "") -> Optional[str]:
    """A PNG of time against the swept size, one line per provider and one panel per case.
    Returns the path, or None when no row has a time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["ms"]]
    if not ok:
        return None
    cases = list(dict.fromkeys(r["case"] for r in ok))
    fig, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 3.8), squeeze=False)
    for ax, case in zip(axes[0], cases):
        sub = [r for r in ok if r["case"] == case]
        keys = list(sub[0]["size"])
        # The x axis is the size that varies (the first one, when several do).
        swept = next((k for k in keys if len({r["size"][k] for r in sub}) > 1), keys[0] if keys else None)
        for prov in dict.fromkeys(r["provider"] for r in sub):
            pts = sorted((r["size"].get(swept, 0), r["ms"]) for r in sub if r["provider"] == prov)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=prov)
        ax.set_title(f"{sub[0]['op']}: {case}", fontsize=9)
        ax.set_xlabel(swept or "")
        ax.set_ylabel("median ms")
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def default_dtype(device: str) -> torch.dtype:
    """The dtype the op benchmarks run in: bfloat16 on CUDA (as a trainer does), float32 on CPU
    (where bfloat16 matmuls are emulated)."""
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


# --- the common command line of the per-op scripts -----------------------------------------------

def add_common_args(p) -> None:
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="one (small) size per case, few repeats")
    p.add_argument("--reps", type=int, default=None, help="timed calls per measurement")
    p.add_argument("--providers", default=None, help="comma-separated subset of the providers; or, each "
                   "with a leading '-' (--providers=-compile), the providers to leave out")
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                   help="each provider in a fresh process, so no other provider's allocator cache or "
                   "compiled code is in its CPU peak memory (default: on for a full CPU run)")
    p.add_argument("--write", metavar="RESULTS.md", help="put the table into this markdown file")
    p.add_argument("--json", metavar="F", help="append the rows to this JSON-lines file")
    p.add_argument("--png", metavar="F", help="plot time against size into this PNG")


def op_script_main(script: str, doc: str, cases_fn: Callable[[str, bool], list[Case]], marker: str,
                   heading: str, argv: Optional[list[str]] = None,
                   matmul_dtype: Optional[torch.dtype] = None) -> list[dict]:
    """Every per-op script's main: parse the common command line (the script's docstring `doc`
    is its --help), run the cases, print the table, and --write it into RESULTS.md between the
    script's `marker`s under `heading` (--json, --png likewise)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    args = parser.parse_args(argv)
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"{os.path.basename(script)}: --device {device} but torch "
                         f"{torch.__version__} sees no CUDA device")
    cases = cases_fn(device, args.quick)
    if args.providers:  # "a,b" keeps those; "-a,-b" drops those
        names = args.providers.split(",")
        drop = all(n.startswith("-") for n in names)
        for c in cases:
            c.providers = [p for p in c.providers if (f"-{p}" not in names if drop else p in names)]
    reps = args.reps or (3 if args.quick else (20 if device.startswith("cuda") else 7))
    info = env_info(device)
    mdt = matmul_dtype or default_dtype(device)
    rates = measure_rates(device, mdt, quick=args.quick)
    print(f"# {machine_line(info)}  {info['date_utc']}\n# {rates_line(rates)}", flush=True)
    if args.json:  # rows go out case by case: a run killed later still leaves what it measured
        write_jsonl(args.json, [], info, rates)
    isolate = args.isolate if args.isolate is not None else (device == "cpu" and not args.quick)
    rows = run_cases(cases, device, reps, warmup=1 if args.quick else 2,
                     isolate_script=os.path.abspath(script) if isolate else None, quick=args.quick,
                     rates=rates, on_case=(lambda rs: append_rows(args.json, rs)) if args.json else None)
    print(markdown_table(rows), flush=True)
    cmd = "python benchmarks/" + os.path.basename(script) + " " + " ".join(sys.argv[1:])
    if args.write:
        write_markdown(args.write, marker, heading, rows, rates, info, cmd.strip())
    if args.png:
        plot(rows, args.png, f"{heading}, {machine_line(info)}")
    return rows


# --- the isolated child ------------------------------------------------------------------------

def load_script(path: str):
    """Import a per-op script by path (it is not a package module)."""
    name = "_bench_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import the benchmark script {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def child_main(spec_json: str) -> None:
    """Measure one provider of one case at every size; print each row as "ROW {json}"."""
    spec = json.loads(spec_json)
    mod = load_script(spec["script"])
    case = next(c for c in mod.cases(spec["device"], spec["quick"])
                if c.op == spec["op"] and c.case == spec["case"])
    for size in case.sizes:
        row = measure_one(case, spec["provider"], size, spec["device"], spec["reps"], spec["warmup"])
        print("ROW " + json.dumps(row), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child_main(sys.argv[2])
    else:
        raise SystemExit("harness.py is imported by the benchmark scripts (or run with --child SPEC)")
