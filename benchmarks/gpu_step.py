"""The whole RL step's throughput on one device (`make gpu-check` runs it on the GPU): rollout and
update tokens per second, step time, peak memory and MFU of a Qwen2.5-0.5B-shaped model.

    python benchmarks/gpu_step.py                          # cuda when present: 1 warm-up + 3 timed steps
    python benchmarks/gpu_step.py --device cpu --steps 1   # the same path on CPU, a 2-layer stand-in
    python benchmarks/gpu_step.py rollout.max_new_tokens=1024   # key=value overrides the config

A random model of Qwen2.5-0.5B's shape (plan_truth.py's QWEN25_05B, built from a transformers Qwen2
config, nothing downloaded; on CPU shrunk by models/stand_in.py `shrink`) and one `Worker` (the
class the trainer's Ray actors run, here without Ray) as rank 0 of a world of one, with the
recipes' settings (plan_truth.py's COMMON): FSDP2 over the one rank, float32 masters, bf16 compute,
gradient checkpointing, the fused LM head, packing as resolved (flash-attn when importable, else
sdpa), FlowRL (its frozen reference), the hf rollout. Every prompt is data.max_prompt_length tokens
and no sampler draws the engine's end token, so every response runs to rollout.max_new_tokens: each
step trains the same tokens. On CUDA a step is 16 prompts x 8 samples of 256 + 256 tokens (128
sequences of 512, 65,536 tokens), a few seconds on an H100.

Measured per step (the device synchronised at each edge): `generate` (rollout tokens/s: response
tokens over its time, the prefill included) and `train_step` (update tokens/s: prompt + response
tokens over its time: the reference's and, with several mini-batches, the old policy's log-prob
forwards, the update's forward and backward, the optimiser, the weight sync). Step time and the
rates are medians of the steps after the first (the warm-up: CUDA's first use, Triton's compiles,
AdamW's states); with one step, that step. MFU counts model FLOPs: 6 x params x tokens for the
update's forward + backward and 2 x params x tokens per extra forward (reference, old log-probs),
params being the LM's (tied embeddings once: their matmul is the head's), without gradient
checkpointing's recompute, the Z-head or attention; `mfu_with_attention` adds the causal
attention's 6 (update) and 2 (each forward) x layers x heads x head_dim x sum of squared sequence
lengths. Both are over the card's bf16 dense peak (H100 SXM and H200: 989 TFLOP/s), for the
update's time (`mfu_update*`) and the whole step's (`mfu_step*`). The last line printed is one JSON
object with these numbers (gpu_check reads it); exit status 1 when a number is not finite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import checkout  # noqa: F401  (before the package: this checkout's)
from gpu_smoke import free_port, run_in_tmp, use_cuda
from plan_truth import COMMON, NO_TOKEN, QWEN25_05B, build_model, finite

# bf16 dense peak (no sparsity) by card name; PCIe and NVL parts run lower clocks and power
PEAK_BF16 = {"H100": 989e12, "H200": 989e12}
PEER = {"source": "prime-rl", "model": "Qwen3-0.6B", "seq_len": 16384, "card": "one H100",
        "tokens_per_s": 11.9e3, "mfu": 0.111}
SIZES = {
    "cuda": ["data.max_prompt_length=256", "rollout.max_new_tokens=256", "data.prompts_per_step=16", "rollout.n=8",
             "optim.mini_batch_prompts=16", "optim.micro_batch_tokens=16384"],
    "cpu": ["data.max_prompt_length=16", "rollout.max_new_tokens=16", "data.prompts_per_step=2", "rollout.n=2",
            "optim.mini_batch_prompts=2", "optim.micro_batch_tokens=128"],
}


def card_peak(name: str | None) -> tuple[float | None, str]:
    """(bf16 dense peak FLOP/s, how it was chosen) for a card named `name`."""
    if not name:
        return None, "unknown peak (no CUDA card)"
    for key, peak in PEAK_BF16.items():
        if key in name and not any(x in name for x in ("PCIe", "NVL")):
            return peak, f"{key} SXM bf16 dense {peak / 1e12:.0f} TFLOP/s"
    return None, f"unknown peak ({name})"


def step_flops(params: int, layers: int, attn_width: int, seq_lens: list[int], extra_forwards: int) -> dict:
    """Model FLOPs of one update: {dense, attention}. Dense: (6 + 2 x extra_forwards) x params x tokens;
    attention (causal, each sequence its own: packing does not attend across them): (6 + 2 x
    extra_forwards) x layers x attn_width x sum of squared lengths."""
    mult = 6 + 2 * extra_forwards
    return {"dense": mult * params * sum(seq_lens),
            "attention": mult * layers * attn_width * sum(s * s for s in seq_lens)}


def comparable(seq_len: int) -> str:
    return (f"not comparable: {seq_len} tokens a sequence against the peer's {PEER['seq_len']}; at 16k the "
            "peer's MFU is mostly attention FLOPs (11.9k tok/s x 6 x 0.6B is 4.3 % of 989 TFLOP/s; adding the "
            "causal attention term at 16k gives its 11.1 %), and longer sequences amortise the rollout's per-token "
            "latency differently; a different model (Qwen2.5-0.5B shape against Qwen3-0.6B), and ours colocates "
            "rollout and update on the card"
            if seq_len != PEER["seq_len"] else
            "same sequence length as the peer; still a different model (Qwen2.5-0.5B shape against Qwen3-0.6B)")


def run(a, cuda: bool, tmp: str, log) -> dict:
    import torch

    from reasonrl_fast.algos import advantages
    from reasonrl_fast.config import load_config
    from reasonrl_fast.errors import ConfigError
    from reasonrl_fast.layout.batches import mini_batches
    from reasonrl_fast.models.stand_in import shrink
    from reasonrl_fast.rollout import get_rollout, sample_seeds
    from reasonrl_fast.trainer.worker import Worker

    fields = QWEN25_05B if cuda else shrink(QWEN25_05B)
    model_dir = f"{tmp}/model"
    overrides = [*COMMON, *SIZES["cuda" if cuda else "cpu"], f"trainer.steps={a.steps}",
                 f"trainer.output_dir={tmp}/run", f"model.path={model_dir}", *a.overrides]
    cfg = load_config(None, overrides)  # before the model's build: a bad key=value costs nothing
    if cfg.rollout.backend != "hf":  # NO_TOKEN is set on the hf engine
        raise ConfigError(f"rollout.backend={cfg.rollout.backend}: gpu_step runs the hf engine only")
    t0 = time.perf_counter()
    build_model(fields, model_dir)
    log(f"model built and saved in {time.perf_counter() - t0:.1f} s")
    w = Worker(cfg, 0, 1, model_dir, get_rollout(cfg.rollout.backend))
    t0 = time.perf_counter()
    info = w.setup("127.0.0.1", free_port())
    layout = info["layout"]
    log(f"setup in {time.perf_counter() - t0:.1f} s: {info['params'] / 1e6:.1f} M params, attention "
        f"{layout.get('attention')}, packed {layout.get('packed')}, fused head {layout.get('fused')}")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    k, n = cfg.data.prompts_per_step, cfg.rollout.n
    plen, vocab = cfg.data.max_prompt_length, len(w.tok)
    gen = torch.Generator().manual_seed(cfg.trainer.seed)
    w.engine.eos_id = NO_TOKEN  # every response runs to max_new_tokens (rollout/hf.py's end token)
    extra = (w.ref is not None) + (len(mini_batches(cfg, k)) > 1)  # reference; old log-probs (worker.train_step)
    steps = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        for step in range(1, a.steps + 1):
            prompts = torch.randint(3, vocab, (k, plen), generator=gen).tolist()  # past pad, bos and eos
            sync()
            t0 = time.perf_counter()
            resp = w.generate(prompts, n, cfg.rollout.temperature, cfg.rollout.top_p,
                              sample_seeds(cfg.trainer.seed, step, 0, k * n), keep=True)
            sync()
            t_gen = time.perf_counter() - t0
            rewards = torch.tensor([float(i % 2) for i in range(k * n)])  # two values in every group: a gradient
            adv = advantages(rewards, torch.arange(k).repeat_interleave(n), norm_by_std=True)
            t0 = time.perf_counter()
            m = w.train_step(adv.tolist(), step)
            sync()
            t_upd = time.perf_counter() - t0
            lens = [plen + len(r) for r in resp]
            st = {"step": step, "generate_s": t_gen, "train_step_s": t_upd, "response_tokens": sum(map(len, resp)),
                  "tokens": sum(lens), "seq_lens": lens,
                  "metrics": {key: v for key, v in m.items() if isinstance(v, (int, float))}}
            steps.append(st)
            log(f"step {step}: generate {t_gen:.2f} s ({st['response_tokens']} response tokens), train_step "
                f"{t_upd:.2f} s ({st['tokens']} tokens); logprob {m['time/logprob_s']:.2f} s, update "
                f"{m['time/update_s']:.2f} s, sync {m['time/sync_s']:.2f} s")
    finally:
        w.shutdown()

    timed = steps[1:] or steps  # the first is the warm-up when there are others
    med = lambda key: statistics.median(s[key] for s in timed)  # noqa: E731
    t_gen, t_upd, t_step = med("generate_s"), med("train_step_s"), med_sum(timed)
    last = timed[-1]
    heads = fields["num_attention_heads"]
    attn_width = heads * fields.get("head_dim", fields["hidden_size"] // heads)
    fl = step_flops(info["params"], fields["num_hidden_layers"], attn_width, last["seq_lens"], extra)
    card = torch.cuda.get_device_name() if cuda else None
    peak, peak_how = card_peak(card)
    seq_len = plen + cfg.rollout.max_new_tokens

    def mfu(flops, secs):
        return None if peak is None else flops / secs / peak

    return {
        "device": "cuda" if cuda else "cpu", "card": card, "peak_flops": peak, "peak": peak_how,
        "torch": torch.__version__, "params": info["params"],
        "layout": {x: v for x, v in layout.items() if x != "notes"},
        "overrides": overrides, "prompts_per_step": k, "samples_per_prompt": n, "prompt_len": plen,
        "response_len": cfg.rollout.max_new_tokens, "seq_len": seq_len, "tokens_per_step": last["tokens"],
        "extra_forwards": extra, "steps": a.steps, "timed_steps": len(timed), "warmup_excluded": len(steps) > 1,
        "step_s": t_step, "generate_s": t_gen, "train_step_s": t_upd,
        "rollout_tokens_per_s": med_rate(timed, "response_tokens", "generate_s"),
        "update_tokens_per_s": med_rate(timed, "tokens", "train_step_s"),
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        "peak_gpu_reserved_mib": torch.cuda.max_memory_reserved() / 2**20 if cuda else None,
        "model_flops_per_step": fl["dense"], "attention_flops_per_step": fl["attention"],
        "mfu_update": mfu(fl["dense"], t_upd), "mfu_step": mfu(fl["dense"], t_step),
        "mfu_update_with_attention": mfu(fl["dense"] + fl["attention"], t_upd),
        "mfu_step_with_attention": mfu(fl["dense"] + fl["attention"], t_step),
        "peer": PEER, "comparable": comparable(seq_len),
        "triton_autotune": os.environ.get("REASONRL_TRITON_AUTOTUNE", "default"),
        "per_step": [{x: v for x, v in s.items() if x != "seq_lens"} for s in steps],
    }


def med_rate(steps: list[dict], tokens: str, secs: str) -> float:
    return statistics.median(s[tokens] / s[secs] for s in steps)


def med_sum(steps: list[dict]) -> float:
    """The median of the steps' whole times (generate + train_step)."""
    return statistics.median(s["generate_s"] + s["train_step_s"] for s in steps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--steps", type=int, default=4, help="steps in all; the first is the warm-up when there are more")
    p.add_argument("--json", metavar="PATH", help="also write the result here")
    p.add_argument("overrides", nargs="*", help="config key=value")
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error("--steps must be at least 1")
    cuda = use_cuda(a.device, "gpu_step")
    if cuda is None:
        return 1
    t_start = time.perf_counter()

    def log(msg):
        print(f"gpu_step: {msg}", flush=True)

    res = run_in_tmp(run, a, cuda, "gpu_step", log)
    if res is None:
        return 2
    res["seconds"] = round(time.perf_counter() - t_start, 1)
    res["finite"] = finite({x: v for x, v in res.items() if isinstance(v, (int, float, list, dict))})
    pct = lambda x: "-" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    log(f"seq {res['seq_len']} ({res['tokens_per_step']} tokens a step); rollout {res['rollout_tokens_per_s']:.0f} "
        f"tok/s, update {res['update_tokens_per_s']:.0f} tok/s, step {res['step_s']:.2f} s; MFU update "
        f"{pct(res['mfu_update'])} (with attention {pct(res['mfu_update_with_attention'])}), step "
        f"{pct(res['mfu_step'])}; {res['peak']}" + ("" if res["finite"] else "; NOT FINITE"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print(json.dumps(res), flush=True)  # the last line: gpu_check reads it
    return 0 if res["finite"] else 1


if __name__ == "__main__":
    sys.exit(main())
