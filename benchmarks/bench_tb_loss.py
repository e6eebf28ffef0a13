"""tb_loss (FlowRL's trajectory-balance loss) forward + backward against eager PyTorch and
torch.compile of it.

    python benchmarks/bench_tb_loss.py                 # CUDA: B x T = 512 x 2048, 512 x 8192, 512 x 32768
    python benchmarks/bench_tb_loss.py --device cpu    # CPU: 512 x 8192
    python benchmarks/bench_tb_loss.py --quick --json r.jsonl --png r.png

Inputs as in a FlowRL step: log Z [B], the policy's token log-probs [B, T] (differentiated), the
reference and old log-probs, the rewards [B] and a response mask whose lengths vary, in the
log-probs' dtype as the trainer passes it. eager is reasonrl_fast.ops.reference.tb_loss. GB/s
counts what must move at least: reading the three [B, T] float32 log-prob tensors and the mask,
and writing the log-probs' gradient.
"""

from __future__ import annotations

import torch

import harness
from harness import Case


def make(provider: str, size: dict, device: str):
    from reasonrl_fast.ops import reference as ref
    from reasonrl_fast.ops import tb_loss

    gen = torch.Generator(device=device).manual_seed(0)
    b, t = size["B"], size["T"]
    log_z = torch.randn(b, device=device, generator=gen).requires_grad_()
    lp = (-torch.rand(b, t, device=device, generator=gen)).requires_grad_()
    ref_lp = -torch.rand(b, t, device=device, generator=gen)
    old = lp.detach() + 0.01 * torch.randn(b, t, device=device, generator=gen)
    reward = torch.randn(b, device=device, generator=gen)
    lengths = torch.randint(1, t + 1, (b, 1), device=device, generator=gen)
    mask = (torch.arange(t, device=device)[None] < lengths).float()

    if provider == "ours":
        f = lambda z, x: tb_loss(z, x, ref_lp, old, reward, mask)  # noqa: E731
    elif provider in ("eager", "compile"):
        def f(z, x):
            return ref.tb_loss(z, x, ref_lp, old, reward, mask)[0]
        if provider == "compile":
            f = torch.compile(f)
    else:
        raise ValueError(f"bench_tb_loss: unknown provider {provider!r}")

    def step():
        f(log_z, lp).backward()
        log_z.grad = lp.grad = None
    return step


def cases(device: str, quick: bool) -> list[Case]:
    """The cases of this op on `device` (one size with quick)."""
    if device.startswith("cuda"):
        sizes = [{"B": 512, "T": 8192}] if quick else [{"B": 512, "T": t} for t in (2048, 8192, 32768)]
    else:
        sizes = [{"B": 16, "T": 64}] if quick else [{"B": 512, "T": 8192}]
    return [Case("tb_loss", "forward + backward", sizes, ["ours", "eager", "compile"], make, "float32",
                 bytes_moved=lambda s: s["B"] * s["T"] * (3 * 4 + 4 + 4))]


def main(argv=None) -> list[dict]:
    return harness.op_script_main(__file__, __doc__, cases, "tb-loss", "tb_loss", argv)


if __name__ == "__main__":
    main()
