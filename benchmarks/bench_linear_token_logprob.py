"""linear_token_logprob (per-token log-probs straight from the LM head's input) against the usual
ways of getting them, forward + backward, side by side in one run.

    python benchmarks/bench_linear_token_logprob.py                  # CUDA, bf16: N = 16384 at
                                                                     # (H, V) = (4096, 131072) and (3584, 152064)
    python benchmarks/bench_linear_token_logprob.py --device cpu   # CPU, fp32, each provider in its own process
    python benchmarks/bench_linear_token_logprob.py --quick --json r.jsonl --png r.png

Each call computes forward + backward of sum(logprob) ("forward + backward") or of
sum(logprob) + sum(entropy) ("fwd + bwd with entropy"), with gradients for the hidden states h
[N, H] and the LM head W [V, H]. Providers:
- ours: reasonrl_fast.ops.linear_token_logprob (no [N, V] logits kept);
- eager: h @ W.T, float32 log_softmax, gather (and the entropy from the same log-probs);
- compile: torch.compile of eager;
- liger_flce: Liger-Kernel's fused linear cross entropy
  (liger_kernel.transformers.functional.liger_fused_linear_cross_entropy, reduction="none": its
  per-token loss is -logprob), the fused Triton kernel Liger uses for a causal LM's loss;
- liger_logprob: the chunked selective log-prob that Liger's LigerFusedLinearGRPOLoss computes
  its per-token log-probs with (liger_kernel.chunked_loss.fused_linear_ppo, sequence x vocab
  chunks in PyTorch): the op of Liger's RL losses that maps (h, W, ids) to log-probs;
- cce: Cut Cross-Entropy (cut_cross_entropy.linear_cross_entropy, reduction="none": -logprob).
None of Liger's or CCE's ops computes the entropy: in the entropy case they run without it
(noted in the table), so they do less work than ours there.

TFLOP/s counts the 6 N H V FLOPs that forward + backward need at least (2 N H V forward, 4 N H V
for dh and dW); % matmul is that rate over the matmul rate measured in the same run (bf16
8192^3 on CUDA).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import Case  # noqa: E402

PROVIDERS = ["ours", "eager", "compile", "liger_flce", "liger_logprob", "cce"]


def _eager(entropy: bool):
    def f(h, W, y):
        logp = torch.log_softmax((h @ W.T).float(), -1)
        lp = logp.gather(-1, y[:, None]).squeeze(-1)
        return lp.sum() + (-(logp.exp() * logp).sum() if entropy else 0.0)
    return f


def _fn(provider: str, entropy: bool):
    """The provider's scalar to differentiate, as a function of (h, W, ids)."""
    if provider == "ours":
        from reasonrl_fast.ops import linear_token_logprob

        def ours(h, W, y):
            if entropy:
                lp, ent = linear_token_logprob(h, W, y, return_entropy=True)
                return lp.sum() + ent.sum()
            return linear_token_logprob(h, W, y).sum()
        return ours
    if provider == "eager":
        return _eager(entropy)
    if provider == "compile":
        return torch.compile(_eager(entropy))
    if provider == "liger_flce":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        return lambda h, W, y: -liger_fused_linear_cross_entropy(h, W, y, reduction="none").sum()
    if provider == "liger_logprob":
        from liger_kernel.chunked_loss.fused_linear_ppo import _ChunkedSelectiveLogProbFunction as F

        return lambda h, W, y: F.apply(h, W, y, None, 1.0, 4096).sum()
    if provider == "cce":
        from cut_cross_entropy import linear_cross_entropy

        return lambda h, W, y: -linear_cross_entropy(h, W, y, reduction="none").sum()
    raise ValueError(f"bench_linear_token_logprob: unknown provider {provider!r}")


def _maker(dtype: torch.dtype, entropy: bool):
    def make(provider: str, size: dict, device: str):
        f = _fn(provider, entropy)
        gen = torch.Generator(device=device).manual_seed(0)
        n, hd, v = size["N"], size["H"], size["V"]
        # Filled in place: no temporary the size of W inflates what is there before a call.
        h = torch.empty(n, hd, device=device, dtype=dtype).normal_(0, 0.25, generator=gen).requires_grad_()
        W = torch.empty(v, hd, device=device, dtype=dtype).normal_(0, hd**-0.5, generator=gen).requires_grad_()
        y = torch.randint(0, v, (n,), device=device, generator=gen)

        def step():
            f(h, W, y).backward()
            h.grad = W.grad = None  # after the call: each call starts from the same state
        return step
    return make


def cases(device: str, quick: bool) -> list[Case]:
    """The cases of this op on `device` (one size each with quick)."""
    cuda = device.startswith("cuda")
    dtype = harness.default_dtype(device)
    if cuda:
        sizes = [{"N": 16384, "H": 4096, "V": 131072}, {"N": 16384, "H": 3584, "V": 152064}]
    else:
        sizes = [{"N": 2048, "H": 128, "V": 32768}, {"N": 256, "H": 896, "V": 151936}]
        if quick:
            sizes = [{"N": 64, "H": 64, "V": 4096}]
    sizes = sizes[:1] if quick else sizes
    flops = lambda s: 6 * s["N"] * s["H"] * s["V"]  # noqa: E731
    dt = str(dtype).replace("torch.", "")
    no_entropy = {p: "no entropy" for p in ("liger_flce", "liger_logprob", "cce")}
    return [
        Case("linear_token_logprob", "forward + backward", sizes, list(PROVIDERS),
             _maker(dtype, False), dt, flops=flops),
        Case("linear_token_logprob", "fwd + bwd with entropy", sizes, list(PROVIDERS),
             _maker(dtype, True), dt, flops=flops, notes=no_entropy),
    ]


def main(argv=None) -> list[dict]:
    return harness.op_script_main(__file__, __doc__, cases, "linear-token-logprob", "linear_token_logprob", argv)


if __name__ == "__main__":
    main()
