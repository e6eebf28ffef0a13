"""group_advantage (GRPO's per-group reward normalisation) against verl's loop over groups.

    python benchmarks/bench_group_advantage.py                 # CUDA: B = 1024, 8192, 32768
    python benchmarks/bench_group_advantage.py --device cpu    # CPU: B = 8192
    python benchmarks/bench_group_advantage.py --quick --json r.jsonl --png r.png

Rewards of B responses in groups of 8, the groups scattered over the batch (a shuffled batch),
normalised by their group's mean and standard deviation. eager is
reasonrl_fast.ops.reference.group_advantage: a Python loop over the groups, as the reference
trainer computes it. triton_sorted (CUDA only) is the O(B) Triton kernel of
reasonrl_fast/ops/triton/group_advantage.py: a stable sort of the ids, then one launch that
walks each group's run. It is not the op's CUDA kernel (ours, O(B^2 / threads)): which one the
op uses on CUDA is decided by this comparison on a card. Forward only: rewards carry no gradient.
"""

from __future__ import annotations

import torch

import harness
from harness import Case


def make(provider: str, size: dict, device: str):
    from reasonrl_fast.ops import group_advantage
    from reasonrl_fast.ops import reference as ref

    gen = torch.Generator(device=device).manual_seed(0)
    b = size["B"]
    r = torch.randn(b, device=device, generator=gen)
    ids = (torch.arange(b, device=device) // 8)[torch.randperm(b, device=device, generator=gen)]
    if provider == "ours":
        return lambda: group_advantage(r, ids)
    if provider == "eager":
        return lambda: ref.group_advantage(r, ids)
    if provider == "triton_sorted":
        # ImportError without triton: the harness records the provider as not installed.
        from reasonrl_fast.ops.triton.group_advantage import group_advantage as triton_sorted

        return lambda: triton_sorted(r, ids)
    raise ValueError(f"bench_group_advantage: unknown provider {provider!r}")


def cases(device: str, quick: bool) -> list[Case]:
    """The cases of this op on `device` (one size with quick)."""
    if device.startswith("cuda"):
        sizes = [{"B": 8192}] if quick else [{"B": b} for b in (1024, 8192, 32768)]
        providers = ["ours", "triton_sorted", "eager"]
    else:
        sizes = [{"B": 256}] if quick else [{"B": 8192}]
        providers = ["ours", "eager"]  # Triton runs on CPU only in its interpreter
    # Read the rewards and group ids, write the advantages.
    return [Case("group_advantage", "forward", sizes, providers, make, "float32",
                 bytes_moved=lambda s: s["B"] * (4 + 8 + 4),
                 notes={"triton_sorted": "stable sort + 1 Triton launch, O(B)"})]


def main(argv=None) -> list[dict]:
    return harness.op_script_main(__file__, __doc__, cases, "group-advantage", "group_advantage", argv)


if __name__ == "__main__":
    main()
