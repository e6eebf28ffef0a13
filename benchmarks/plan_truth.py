"""The memory planner against a real run: `python -m reasonrl_fast.plan`'s terms beside the peaks two
trainer steps of one `Worker` measure, phase by phase (`make gpu-check` runs it on the GPU).

    python benchmarks/plan_truth.py                      # cuda when present: a Qwen2.5-0.5B-shaped model
    python benchmarks/plan_truth.py --device cpu         # the same flow on CPU, a 2-layer stand-in, the CPU planner
    python benchmarks/plan_truth.py --device cpu --smoke # its fastest run
    python benchmarks/plan_truth.py --json out.json --md out.md

A random model of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads / 2 key/value heads, MLP
4864, vocabulary 151936, tied embeddings; built from its config, nothing downloaded; on CPU the
same architecture shrunk by models/stand_in.py `shrink`) is saved with the embedded character
tokenizer, and one `Worker` (the class the trainer's Ray actors run, here without Ray) sets up as
rank 0 of a world of one with the recipes' settings: FSDP2 over the one rank, float32 master
weights, bf16 compute, gradient checkpointing, the fused LM head, packing as resolved (flash-attn
where installed, else sdpa), FlowRL (its frozen reference and Z-head), the hf rollout; a step's
mini-batches run as micro-batches of optim.micro_batch_tokens. Every prompt is
data.max_prompt_length tokens and the engine's end token is one no sampler draws, so every
response runs to rollout.max_new_tokens: the planner's worst case.

Each phase starts from a reset peak: the rollout (`generate`), the update (`train_step`'s log-prob
passes, mini-batches and optimiser steps) and the weight sync (the end of `train_step`, timed
through the worker's `sync_weights`). The planner counts the sync in its rollout phase (the engine
is awake, the buckets are gathered): its rollout total is compared with the larger of the
rollout's and the sync's peaks, its update total with the update's. What the worker holds
between phases is counted tensor by tensor (the storages of the policy's parameters, the AdamW
states, the reference, the engine's copy) and set beside the planner's terms for them; what each
phase adds on top is compared with the planner's terms for it.

On CUDA the peaks are torch.cuda.max_memory_allocated: the tensors the caching allocator hands
out. Neither side counts the CUDA context, NCCL's buffers, workspaces outside the allocator or
blocks the allocator caches but does not use (max_memory_reserved, shown beside): the planner's
GPU_RESERVE_GIB leaves room for those. On CPU they are the peak resident set (VmHWM, reset through
/proc/self/clear_refs), with glibc's mmap threshold fixed so that freed blocks leave it, as the
planner's CPU estimate is checked in tests/test_plan.py; its process baseline stands for the
interpreter and its libraries. A phase PASSes when measured / planned is within TOLERANCE. Exit
status 0 when it ran, whether or not the two agree (that is in the output and the JSON); 1 on a
number that is not finite. Extra `key=value` arguments override the config.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import resource
import sys
import time

import checkout  # noqa: F401  (before the package: this checkout's)
from gpu_smoke import free_port, run_in_tmp, use_cuda

GIB = 2 ** 30
TOLERANCE = 0.15
NO_TOKEN = -1  # an end-of-sequence id no sampler draws: every response runs to max_new_tokens

QWEN25_05B = {  # Qwen/Qwen2.5-0.5B's config.json, its shape and context
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
    "tie_word_embeddings": True, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
    "use_sliding_window": False, "hidden_act": "silu"}

# The recipes' settings (configs/*.yaml) on a world of one.
COMMON = ["trainer.workers_per_node=1", "trainer.sharding=fsdp", "model.dtype=float32", "model.compute_dtype=bfloat16",
          "model.gradient_checkpointing=true", "model.fused_lm_head=true", "data.packing=auto", "rollout.backend=hf",
          "algo=flowrl", "sft.steps=0", "trainer.val_every=0"]
# Sizes: 16 sequences of 1024 tokens on a GPU, two mini-batches of two micro-batches each (inside
# gpu_check's 90 s with the model's build); on CPU a few short ones.
SIZES = {
    "cuda": ["data.max_prompt_length=256", "rollout.max_new_tokens=768", "data.prompts_per_step=4", "rollout.n=4",
             "optim.mini_batch_prompts=2", "optim.micro_batch_tokens=4096"],
    "cpu": ["data.max_prompt_length=32", "rollout.max_new_tokens=96", "data.prompts_per_step=4", "rollout.n=2",
            "optim.mini_batch_prompts=2", "optim.micro_batch_tokens=256"],
    "smoke": ["data.max_prompt_length=16", "rollout.max_new_tokens=32", "data.prompts_per_step=2", "rollout.n=2",
              "optim.mini_batch_prompts=1", "optim.micro_batch_tokens=96"],
}

# How the planner's terms (plan.py `estimate`) are measured. Held: tensors the worker keeps between
# phases, by the storages it holds. Each phase's terms: what the phase adds on top of them.
HELD = ("policy parameters", "AdamW states (2)", "reference model", "hf rollout copy")
PHASE_TERMS = {"generate": ("hf rollout KV cache",), "sync": ("weight sync buckets",),
               "update": ("gradients", "FSDP2 root, gathered", "FSDP2 layers, gathered", "activations", "logits")}
UNHELD = ("process baseline",)  # CPU: the interpreter and its libraries, set beside what no tensor explains


# ---------------------------------------------------------------- measuring


class Meter:
    """The memory now and the peak since the last `start`: allocated CUDA memory, or the resident set."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.resettable = cuda or os.access("/proc/self/clear_refs", os.W_OK)

    def now(self) -> int:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        return _status_kb("VmRSS") * 1024

    def start(self) -> int:
        """Reset the peak to the present; returns the present."""
        gc.collect()  # garbage of earlier phases is not this phase's
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            _malloc_trim()
            if self.resettable:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # VmHWM := VmRSS
        return self.now()

    def peak(self) -> tuple[int, int | None]:
        """(the peak since `start`, the allocator's reserved peak on CUDA or None)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        if self.resettable:
            return _status_kb("VmHWM") * 1024, None
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, None  # the process's, as the worker's


def _status_kb(name: str) -> int:
    with open("/proc/self/status") as f:
        return int(next(x for x in f if x.startswith(name + ":")).split()[1])


def _malloc_trim() -> None:
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def fix_mmap_threshold() -> None:
    """glibc's malloc raises its mmap threshold as large blocks are freed and then keeps freed
    blocks in its heaps: the resident set would hold memory no tensor uses. Fixed at 64 KiB, every
    larger block leaves it when freed (tests/test_plan.py's MALLOC_MMAP_THRESHOLD_)."""
    try:
        ctypes.CDLL(None).mallopt(-3, 65536)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def storage_bytes(tensors) -> int:
    """Bytes of the storages behind `tensors` (a DTensor's local shard), each storage once: the
    lean decoder's fused q/k/v and tied embeddings share theirs."""
    seen = {}
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        s = t.untyped_storage()
        seen[(str(t.device), s.data_ptr())] = s.nbytes()
    return sum(seen.values())


def held_bytes(w) -> dict[str, int]:
    """What the worker holds between phases, by the planner's names."""
    import torch

    states = [v for st in w.opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return {"policy parameters": storage_bytes(w.actor.parameters()), "AdamW states (2)": storage_bytes(states),
            "reference model": storage_bytes(w.ref.parameters()) if w.ref is not None else 0,
            "hf rollout copy": storage_bytes(w.engine.model.parameters())}


# ---------------------------------------------------------------- the comparison (pure)


def _ratio(measured: float, planned: float) -> float | None:
    return measured / planned if planned > 0 else None


def phase_peaks(steps: list[dict]) -> dict[str, dict]:
    """{generate, update, sync: {base, peak, max_peak}} (bytes) from the steps' measures ({step,
    name: {base, peak}}): the last step's base and peak (the steady state: the first update also
    allocates AdamW's states, which are held from then on) and the highest peak of any step."""
    out = {}
    for st in steps:
        for name, v in st.items():
            if name != "step":
                out[name] = {"base": v["base"], "peak": v["peak"],
                             "max_peak": max(v["peak"], out.get(name, {}).get("max_peak", 0))}
    return out


def compare(terms: list[dict], held: dict[str, int], at_rest: int, phases: dict[str, dict]) -> dict:
    """The planner's `terms` ([{name, rollout, update}] in GiB) against what was measured: `held`
    (bytes by term) and `at_rest` (bytes before the last rollout), `phases` (`phase_peaks`).
    Returns {rows, phases}: a row per held term, one for what no held tensor explains, one per
    phase's own terms (what it adds on top of the memory before it, in the last step), one for any
    planned term none of these measures; each of the planner's phases, its total against the
    highest measured peak of the sub-phases it covers."""
    by = {t["name"]: t for t in terms}
    rows, used = [], set()

    def row(name, planned, measured_bytes, how, names):
        used.update(names)
        m = None if measured_bytes is None else measured_bytes / GIB
        rows.append({"term": name, "planned_gib": planned, "measured_gib": m, "how": how,
                     "ratio": None if m is None else _ratio(m, planned)})

    for name in HELD:
        if name in by:
            t = by[name]
            row(name, max(t["rollout"], t["update"]), held.get(name, 0), "storages held between phases", [name])
    unheld = [n for n in UNHELD if n in by]
    row("not in a held tensor (at rest)" + (f": {', '.join(unheld)}" if unheld else ""),
        sum(by[n]["rollout"] for n in unheld), at_rest - sum(held.get(n, 0) for n in HELD if n in by),
        "memory before the rollout less the held storages", unheld)
    for phase, names in PHASE_TERMS.items():
        present = [n for n in names if n in by]
        if present:
            key = "update" if phase == "update" else "rollout"
            p = phases.get(phase)
            row(f"{phase}: " + ", ".join(present), sum(by[n][key] for n in present),
                None if p is None else p["peak"] - p["base"], f"peak of {phase} less the memory before it", present)
    for name, t in by.items():
        if name not in used:
            row(name, max(t["rollout"], t["update"]), None, "not measured apart", [name])
    planned = {"rollout": sum(t["rollout"] for t in terms), "update": sum(t["update"] for t in terms)}
    measured = {"rollout": max([phases[k]["max_peak"] for k in ("generate", "sync") if k in phases], default=None),
                "update": phases["update"]["max_peak"] if "update" in phases else None}
    out = {}
    for k in ("rollout", "update"):
        m = None if measured[k] is None else measured[k] / GIB
        r = None if m is None else _ratio(m, planned[k])
        out[k] = {"planned_gib": planned[k], "measured_gib": m, "ratio": r,
                  "pass": r is not None and abs(r - 1) <= TOLERANCE}
    return {"rows": rows, "phases": out}


def _g(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def markdown(result: dict) -> str:
    lines = ["| term | planned GiB | measured GiB | measured / planned | measured as |", "|---|---:|---:|---:|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['term']} | {_g(r['planned_gib'])} | {_g(r['measured_gib'])} | {_g(r['ratio'])} "
                     f"| {r['how']} |")
    for k, p in result["phases"].items():
        verdict = "PASS" if p["pass"] else "FAIL"
        lines.append(f"| **{k} phase, total** | {_g(p['planned_gib'])} | {_g(p['measured_gib'])} | {_g(p['ratio'])} "
                     f"| {verdict} (within {TOLERANCE:.0%}) |")
    return "\n".join(lines) + "\n"


def finite(x) -> bool:
    """Every number in x (nested dicts and lists) finite."""
    if isinstance(x, dict):
        return all(finite(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return all(finite(v) for v in x)
    return not isinstance(x, float) or math.isfinite(x)


# ---------------------------------------------------------------- the run


def build_model(fields: dict, out_dir: str) -> str:
    """A random model of `fields` with the embedded character tokenizer, saved in bf16 (the worker
    loads it in its master dtype: half the bytes to write and read)."""
    import torch
    from transformers import AutoModelForCausalLM

    from reasonrl_fast.models import stand_in

    tok = stand_in.tokenizer(chat=False)
    config = stand_in.hf_config({**fields, "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id,
                                 "eos_token_id": tok.eos_token_id})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    del model
    return out_dir


def train_steps(w, cfg, meter: Meter, count: int, log) -> tuple:
    """`count` trainer steps of the set-up worker `w` on full-length prompts and responses, each
    phase measured from a reset peak. Returns (per step {step, generate, update, sync: {base, peak,
    reserved}} in bytes, the steps' metrics, `held_bytes` and the memory before the last step's
    rollout, whether every response was full length)."""
    import torch

    from reasonrl_fast.algos import advantages
    from reasonrl_fast.rollout import sample_seeds

    w.engine.eos_id = NO_TOKEN  # the hf engine's end token (rollout/hf.py): none, so every response is full length
    k, n = cfg.data.prompts_per_step, cfg.rollout.n
    length, vocab = cfg.data.max_prompt_length, len(w.tok)
    gen = torch.Generator().manual_seed(cfg.trainer.seed)
    steps, metrics, marks, full = [], [], {}, True

    def keep(name, base, peak):
        steps[-1][name] = {"base": base, "peak": peak[0], "reserved": peak[1]}

    sync = w.sync_weights

    def timed_sync():  # the end of train_step: the update's peak ends here, the sync's begins
        keep("update", marks["update"], meter.peak())
        base = meter.start()
        sync()
        keep("sync", base, meter.peak())
        marks["synced"] = True

    w.sync_weights = timed_sync  # train_step calls it through the instance
    for step in range(1, count + 1):
        steps.append({"step": step})
        prompts = torch.randint(3, vocab, (k, length), generator=gen).tolist()  # past pad, bos and eos
        held, at_rest = held_bytes(w), meter.now()  # the last step's count: AdamW's states exist after the first
        t0 = time.perf_counter()
        base = meter.start()
        resp = w.generate(prompts, n, cfg.rollout.temperature, cfg.rollout.top_p,
                          sample_seeds(cfg.trainer.seed, step, 0, k * n), keep=True)
        keep("generate", base, meter.peak())
        t_gen = time.perf_counter() - t0
        full &= len(resp) == k * n and all(len(x) == cfg.rollout.max_new_tokens for x in resp)
        rewards = torch.tensor([float(i % 2) for i in range(k * n)])  # two values in every group: a gradient
        adv = advantages(rewards, torch.arange(k).repeat_interleave(n), norm_by_std=True)
        marks.clear()
        t0 = time.perf_counter()
        marks["update"] = meter.start()
        m = w.train_step(adv.tolist(), step)
        if "synced" not in marks:  # rollout.sync_every > 1: no sync this step
            keep("update", marks["update"], meter.peak())
        metrics.append({key: v for key, v in m.items() if isinstance(v, (int, float))})
        log(f"step {step}: generate {t_gen:.1f} s ({sum(map(len, resp))} response tokens), train_step "
            f"{time.perf_counter() - t0:.1f} s; " + ", ".join(f"{key} {steps[-1][key]['peak'] / GIB:.3f} GiB peak"
                                                        for key in ("generate", "update", "sync") if key in steps[-1]))
    return steps, metrics, held, at_rest, full


def run(a, cuda: bool, tmp: str, log) -> dict:
    import torch

    from reasonrl_fast import plan
    from reasonrl_fast.config import load_config
    from reasonrl_fast.errors import ConfigError
    from reasonrl_fast.layout.shape import model_fields, shape_from_config
    from reasonrl_fast.models.stand_in import shrink
    from reasonrl_fast.rollout import get_rollout
    from reasonrl_fast.trainer.worker import Worker

    size = "cuda" if cuda else ("smoke" if a.smoke else "cpu")
    fields = QWEN25_05B if cuda else shrink(QWEN25_05B)
    model_dir = os.path.join(tmp, "model")
    overrides = [*COMMON, *SIZES[size], f"trainer.steps={a.steps}", f"trainer.output_dir={tmp}/run",
                 f"model.path={model_dir}", *a.overrides]
    cfg = load_config(None, overrides)  # before the model's build: a bad key=value costs nothing
    if cfg.rollout.backend != "hf":  # its terms are the hf copy's, and NO_TOKEN is set on that engine
        raise ConfigError(f"rollout.backend={cfg.rollout.backend}: plan_truth measures the hf engine only")
    t0 = time.perf_counter()
    build_model(fields, model_dir)
    log(f"model built and saved in {time.perf_counter() - t0:.1f} s")
    d, where, _ = model_fields(model_dir, f"model.path={model_dir!r}")
    shape = shape_from_config(d, where)
    device = "gpu" if cuda else "cpu"
    memory = (torch.cuda.get_device_properties(0).total_memory / GIB if cuda
              else plan.host_memory_gib() / cfg.trainer.workers_per_node)
    est = plan.estimate(cfg, shape, device, memory)
    log(f"{shape.params / 1e9:.3g} B params; the planner ({device}, {memory:.0f} GiB):\n{plan.render(est)}")

    meter = Meter(cuda)
    w = Worker(cfg, 0, 1, model_dir, get_rollout(cfg.rollout.backend))
    t0 = time.perf_counter()
    info = w.setup("127.0.0.1", free_port())
    log(f"setup in {time.perf_counter() - t0:.1f} s")
    try:
        steps, metrics, held, at_rest, full = train_steps(w, cfg, meter, a.steps, log)
    finally:
        w.shutdown()

    result = compare([{"name": t.name, "rollout": t.rollout, "update": t.update} for t in est.terms], held, at_rest,
                     phase_peaks(steps))
    worker_layout = {key: v for key, v in info["layout"].items() if key != "notes"}
    planned_layout = {key: v for key, v in est.layout.to_dict().items() if key != "notes"}
    return {"device": "cuda" if cuda else "cpu", "card": torch.cuda.get_device_name() if cuda else None,
            "memory_gib": memory, "reserve_gib": est.reserve_gib, "torch": torch.__version__,
            "measure": ("torch.cuda.max_memory_allocated per phase (reset_peak_memory_stats before each)" if cuda
                        else "peak resident set (VmHWM) per phase, reset through /proc/self/clear_refs"
                        if meter.resettable else "max RSS of the process (ru_maxrss: not reset between phases)"),
            "overrides": overrides, "params": shape.params, "shape": {key: v for key, v in vars(shape).items()
                                                                      if key != "config"},
            "layout": worker_layout, "layout_matches_planner": worker_layout == planned_layout,
            "planned_layout": planned_layout, "attention": est.layout.attention,
            "planned_terms": [{"name": t.name, "rollout_gib": t.rollout, "update_gib": t.update, "note": t.note}
                              for t in est.terms],
            "held_gib": {key: v / GIB for key, v in held.items()}, "at_rest_gib": at_rest / GIB,
            "steps": [{key: v if key == "step" else {f"{x}_gib": None if b is None else b / GIB for x, b in v.items()}
                       for key, v in st.items()} for st in steps],
            "full_length_responses": full, "metrics": metrics, **result,
            "agree": all(ph["pass"] for ph in result["phases"].values())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--smoke", action="store_true", help="CPU: the fewest, shortest sequences")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--json", metavar="PATH", help="write the results here")
    p.add_argument("--md", metavar="PATH", help="write the markdown table here")
    p.add_argument("overrides", nargs="*", help="config key=value")
    a = p.parse_args(argv)
    if a.steps < 2:  # the second is the steady state: AdamW's states are allocated in the first update
        p.error("--steps must be at least 2")
    cuda = use_cuda(a.device, "plan_truth")
    if cuda is None:
        return 1
    if not cuda:
        fix_mmap_threshold()
    t_start = time.perf_counter()

    def log(msg):
        print(f"plan_truth: {msg}", flush=True)

    res = run_in_tmp(run, a, cuda, "plan_truth", log)
    if res is None:
        return 2
    res["seconds"] = round(time.perf_counter() - t_start, 1)
    res["finite"] = finite({k: res[k] for k in ("rows", "phases", "metrics", "planned_terms", "steps")})
    md = markdown(res)
    print(md, flush=True)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    if not res["layout_matches_planner"]:
        log(f"the worker's layout {res['layout']} differs from the one the planner counted {res['planned_layout']}")
    if not res["full_length_responses"]:
        log("some responses were shorter than rollout.max_new_tokens: below the planner's worst case")
    ph = res["phases"]
    log(", ".join(f"{k} measured {_g(v['measured_gib'])} / planned {_g(v['planned_gib'])} GiB "
                  f"({_g(v['ratio'])}x) {'PASS' if v['pass'] else 'FAIL'}" for k, v in ph.items())
        + f"; {'agrees' if res['agree'] else 'does NOT agree'} within {TOLERANCE:.0%} ({res['device']}, "
          f"{res['seconds']:.0f} s)" + ("" if res["finite"] else "; NOT FINITE"))
    return 0 if res["finite"] else 1


if __name__ == "__main__":
    sys.exit(main())
