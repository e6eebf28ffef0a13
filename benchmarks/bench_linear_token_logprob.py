"""linear_token_logprob (per-token log-probs straight from the LM head's input) against the usual
ways of getting them, forward + backward, side by side in one run.

    python benchmarks/bench_linear_token_logprob.py                  # CUDA, bf16: N = 16384 at
                                                                     # (H, V) = (4096, 131072) and (3584, 152064)
    python benchmarks/bench_linear_token_logprob.py --device cpu   # CPU, fp32, each provider in its own process
    python benchmarks/bench_linear_token_logprob.py --quick --json r.jsonl --png r.png

Each call computes forward + backward of sum(logprob) ("forward + backward"), of
sum(logprob) + sum(entropy) ("fwd + bwd with entropy"), or of sum(logprob) over the rows that
are not ignored when 40 % of them are (ignore_index = -100 in runs of 4 rows in every 10, as
prompts and padding are in an RL batch: "fwd + bwd, 40 % rows ignored"), with gradients for the
hidden states h [N, H] and the LM head W [V, H]. Every provider gets the same inputs, in one
process on CUDA. Providers:
- ours: reasonrl_fast.ops.linear_token_logprob (no [N, V] logits kept; ignored rows skipped);
- eager: h @ W.T, float32 log_softmax, gather (and the entropy from the same log-probs);
- compile: torch.compile of eager;
- liger_flce: Liger-Kernel's fused linear cross entropy
  (liger_kernel.transformers.functional.liger_fused_linear_cross_entropy, reduction="none": its
  per-token loss is -logprob), the fused Triton kernel Liger uses for a causal LM's loss; it
  computes the gradient in the forward, over every row, ignored ones included;
- liger_logprob: the chunked selective log-prob that Liger's LigerFusedLinearGRPOLoss computes
  its per-token log-probs with (liger_kernel.chunked_loss.fused_linear_ppo, vocabulary chunks in
  PyTorch, the logits recomputed in the backward): the op of Liger's RL losses that maps
  (h, W, ids) to log-probs; it takes no ignore_index, so it computes every row and the ignored
  ones are masked after it;
- cce: Cut Cross-Entropy (cut_cross_entropy.linear_cross_entropy, reduction="none": -logprob)
  in exact mode (filter_eps=None): its default skips gradient blocks below a threshold, which on
  random (near-uniform) logits skips almost everything and times work no real model leaves out.
None of Liger's or CCE's ops computes the entropy: in the entropy case they run without it
(noted in the table), so they do less work than ours there.

TFLOP/s counts the 6 N H V FLOPs that forward + backward need at least (2 N H V forward, 4 N H V
for dh and dW; N the rows not ignored); % matmul is that rate over the matmul rate measured in
the same run (bf16 8192^3 on CUDA). exec TFLOP/s counts what each provider executes: 8 N H V
where the backward recomputes the logits (ours, cce and liger_logprob; ours and cce over the
rows not ignored, liger_logprob over all), 6 N H V over all rows for eager, compile and
liger_flce, which keep the logits or their gradient.
"""

from __future__ import annotations

import torch

import harness
from harness import Case

PROVIDERS = ["ours", "eager", "compile", "liger_flce", "liger_logprob", "cce"]


IGNORE = -100


def _eager(entropy: bool):
    def f(h, W, y):
        logp = torch.log_softmax((h @ W.T).float(), -1)
        valid = y != IGNORE
        lp = logp.gather(-1, y.clamp(min=0)[:, None]).squeeze(-1) * valid
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

        return lambda h, W, y: -liger_fused_linear_cross_entropy(h, W, y, ignore_index=IGNORE,
                                                                  reduction="none").sum()
    if provider == "liger_logprob":
        from liger_kernel.chunked_loss.fused_linear_ppo import _ChunkedSelectiveLogProbFunction as F

        return lambda h, W, y: (F.apply(h, W, y.clamp(min=0), None, 1.0, 4096) * (y != IGNORE)).sum()
    if provider == "cce":
        from cut_cross_entropy import linear_cross_entropy

        return lambda h, W, y: -linear_cross_entropy(h, W, y, ignore_index=IGNORE, reduction="none",
                                                     filter_eps=None).sum()
    raise ValueError(f"bench_linear_token_logprob: unknown provider {provider!r}")


def ignored_rows(n: int) -> torch.Tensor:
    """Rows 0-3 of every 10 (40 % when 10 divides n): runs of ignored rows, as prompts are."""
    return torch.arange(n) % 10 < 4


def _maker(dtype: torch.dtype, entropy: bool, ignored: bool = False):
    def make(provider: str, size: dict, device: str):
        f = _fn(provider, entropy)
        gen = torch.Generator(device=device).manual_seed(0)
        n, hd, v = size["N"], size["H"], size["V"]
        # Filled in place: no temporary the size of W inflates what is there before a call.
        h = torch.empty(n, hd, device=device, dtype=dtype).normal_(0, 0.25, generator=gen).requires_grad_()
        W = torch.empty(v, hd, device=device, dtype=dtype).normal_(0, hd**-0.5, generator=gen).requires_grad_()
        y = torch.randint(0, v, (n,), device=device, generator=gen)
        if ignored:
            y[ignored_rows(n).to(device)] = IGNORE

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
    dt = str(dtype).replace("torch.", "")
    no_entropy = {p: "no entropy" for p in ("liger_flce", "liger_logprob", "cce")}
    exact = {"cce": "exact"}
    return [
        Case("linear_token_logprob", "forward + backward", sizes, list(PROVIDERS),
             _maker(dtype, False), dt, flops=_flops(6, False), notes=exact, work=_work(False)),
        Case("linear_token_logprob", "fwd + bwd with entropy", sizes, list(PROVIDERS),
             _maker(dtype, True), dt, flops=_flops(6, False),
             notes={**no_entropy, "cce": "exact, no entropy"}, work=_work(False)),
        Case("linear_token_logprob", "fwd + bwd, 40 % rows ignored", sizes, list(PROVIDERS),
             _maker(dtype, False, ignored=True), dt, flops=_flops(6, True), notes=exact, work=_work(True)),
    ]


def _flops(per_nhv: int, only_valid: bool):
    """per_nhv x N H V, N the rows not ignored when only_valid."""
    def f(s: dict) -> float:
        n = s["N"] - int(ignored_rows(s["N"]).sum()) if only_valid else s["N"]
        return per_nhv * n * s["H"] * s["V"]
    return f


def _work(ignored: bool) -> dict:
    """The FLOPs each provider executes (see the module docstring)."""
    return {"ours": _flops(8, ignored), "cce": _flops(8, ignored), "liger_logprob": _flops(8, False),
            "eager": _flops(6, False), "compile": _flops(6, False), "liger_flce": _flops(6, False)}


def main(argv=None) -> list[dict]:
    return harness.op_script_main(__file__, __doc__, cases, "linear-token-logprob", "linear_token_logprob", argv)


if __name__ == "__main__":
    main()
