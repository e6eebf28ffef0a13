"""A two-step smoke run of the trainer's worker on one device (`make gpu-check` runs it on the GPU).

    python benchmarks/gpu_smoke.py                       # cuda when present: bf16, FSDP2 over NCCL
    python benchmarks/gpu_smoke.py --device cpu --steps 1   # the same path on CPU (float32, gloo)

One `Worker` (the class the trainer's Ray actors run, here without Ray, which a GPU machine may
not have) sets up as rank 0 of a world of one: the process group (NCCL on CUDA), the embedded
model (untrained: no warm start) in bf16 on CUDA, sharded with FSDP2, the fused LM head forced on,
the hf rollout through the lean decoder. Then each step: rollout with the step's seeds, a reward
(1 when the right sum appears in the response: the smoke needs a signal, not the task's scorer),
group advantages, and `train_step` (old and reference log-probs, the FlowRL update, the weight
sync). Every number it prints must be finite; the exit status says whether it was. Extra
`key=value` arguments override the config (e.g. `algo=grpo`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import tempfile
import time

import checkout  # noqa: F401  (before the package: this checkout's)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def use_cuda(choice: str, prog: str) -> bool | None:
    """Whether a run asked for --device `choice` (auto, cuda, cpu) runs on CUDA; None, said in
    one line, when CUDA is asked for and torch sees none. On CPU the GPUs are hidden: the worker
    picks its device by what it sees."""
    import torch

    cuda = choice == "cuda" or (choice == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        print(f"{prog}: --device cuda, but torch sees no CUDA device", flush=True)
        return None
    if not cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return cuda


def run_in_tmp(run, a, cuda: bool, prog: str, log) -> dict | None:
    """`run(a, cuda, tmp, log)` in a temporary directory named for `prog`, with transformers'
    progress bars off (the model's save and loads: one line each in the output is enough); None
    after a bad key=value (a UserError), said in one line as the package's commands say it."""
    from reasonrl_fast.errors import UserError
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix=f"{prog}_") as tmp:
        try:
            return run(a, cuda, tmp, log)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("overrides", nargs="*", help="config key=value")
    a = p.parse_args(argv)
    cuda = use_cuda(a.device, "gpu_smoke")
    if cuda is None:
        return 1
    import torch

    from reasonrl_fast.algos import advantages
    from reasonrl_fast.config import load_config
    from reasonrl_fast.data.records import prompt_ids
    from reasonrl_fast.rollout import get_rollout, sample_seeds
    from reasonrl_fast.runtime.datasets import load_datasets
    from reasonrl_fast.trainer.sft import warm_start
    from reasonrl_fast.trainer.worker import Worker

    with tempfile.TemporaryDirectory(prefix="gpu_smoke_") as tmp:
        cfg = load_config(None, [
            f"trainer.output_dir={tmp}/run", f"trainer.steps={a.steps}", "trainer.workers_per_node=1",
            "trainer.sharding=fsdp", f"model.dtype={'bfloat16' if cuda else 'float32'}", "model.fused_lm_head=true",
            "sft.steps=0", f"sft.cache_dir={tmp}/sft", "data.prompts_per_step=8", "rollout.n=4",
            "algo=flowrl", *a.overrides])
        model_path = warm_start(cfg, log=lambda m: None)
        w = Worker(cfg, 0, 1, model_path, get_rollout(cfg.rollout.backend))
        t0 = time.perf_counter()
        info = w.setup("127.0.0.1", free_port())
        print(f"gpu_smoke: setup in {time.perf_counter() - t0:.1f} s: {json.dumps(info)}", flush=True)
        train, _ = load_datasets(cfg, w.tok)
        n, k = cfg.rollout.n, cfg.data.prompts_per_step
        ok = True
        for step in range(1, a.steps + 1):
            t0 = time.perf_counter()
            items = train[(step - 1) * k: step * k]
            prompts = [prompt_ids(it, w.tok) for it in items]
            resp = w.generate(prompts, n, cfg.rollout.temperature, cfg.rollout.top_p,
                              sample_seeds(cfg.trainer.seed, step, 0, k * n), keep=True)
            texts = w.tok.batch_decode(resp, skip_special_tokens=True)
            rewards = torch.tensor([float(str(items[i // n]["answer"]) in t) for i, t in enumerate(texts)])
            adv = advantages(rewards, torch.arange(k).repeat_interleave(n), norm_by_std=True)
            m = w.train_step(adv.tolist(), step)
            nums = {key: v for key, v in m.items() if isinstance(v, (int, float))}
            bad = [key for key, v in nums.items() if not math.isfinite(v)]
            ok &= not bad and len(resp) == k * n
            print(f"gpu_smoke: step {step} in {time.perf_counter() - t0:.2f} s, {sum(map(len, resp))} response "
                  f"tokens, reward {float(rewards.mean()):.3f}; " + json.dumps(nums)
                  + (f"; NOT FINITE: {bad}" if bad else ""), flush=True)
        if cuda:
            print(f"gpu_smoke: peak CUDA memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB on "
                  f"{torch.cuda.get_device_name()}", flush=True)
        w.shutdown()
    print("gpu_smoke: " + ("ok" if ok else "FAILED: a metric was not finite"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
