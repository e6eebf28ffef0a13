"""masked_mean (the mean of hidden states over a sequence's unmasked positions, as a Z-head's
input) forward + backward against eager PyTorch and torch.compile of it.

    python benchmarks/bench_masked_mean.py                 # CUDA, bf16: B x T x H = 64 x 2048 x {896, 3584}
    python benchmarks/bench_masked_mean.py --device cpu    # CPU, fp32: 64 x 2048 x 896
    python benchmarks/bench_masked_mean.py --quick --json r.jsonl --png r.png

eager is reasonrl_fast.ops.reference.masked_mean. GB/s counts what must move at least: reading
the [B, T, H] hidden states once and writing their gradient once.
"""

from __future__ import annotations

import torch

import harness
from harness import Case


def _maker(dtype: torch.dtype):
    def make(provider: str, size: dict, device: str):
        from reasonrl_fast.ops import masked_mean
        from reasonrl_fast.ops import reference as ref

        gen = torch.Generator(device=device).manual_seed(0)
        b, t, h = size["B"], size["T"], size["H"]
        x = torch.randn(b, t, h, device=device, dtype=dtype, generator=gen).requires_grad_()
        mask = torch.arange(t, device=device)[None] < torch.randint(1, t + 1, (b, 1), device=device, generator=gen)
        f = {"ours": masked_mean, "eager": ref.masked_mean}.get(provider)
        if provider == "compile":
            f = torch.compile(ref.masked_mean)
        if f is None:
            raise ValueError(f"bench_masked_mean: unknown provider {provider!r}")

        def step():
            f(x, mask).sum().backward()
            x.grad = None
        return step
    return make


def cases(device: str, quick: bool) -> list[Case]:
    """The cases of this op on `device` (one size with quick)."""
    cuda = device.startswith("cuda")
    dtype = harness.default_dtype(device)
    if cuda:
        sizes = [{"B": 64, "T": 2048, "H": h} for h in (896, 3584)]
    else:
        sizes = [{"B": 4, "T": 32, "H": 64}] if quick else [{"B": 64, "T": 2048, "H": 896}]
    sizes = sizes[:1] if quick else sizes
    elt = torch.empty(0, dtype=dtype).element_size()
    return [Case("masked_mean", "forward + backward", sizes, ["ours", "eager", "compile"], _maker(dtype),
                 str(dtype).replace("torch.", ""), bytes_moved=lambda s: 2 * s["B"] * s["T"] * s["H"] * elt)]


def main(argv=None) -> list[dict]:
    return harness.op_script_main(__file__, __doc__, cases, "masked-mean", "masked_mean", argv)


if __name__ == "__main__":
    main()
