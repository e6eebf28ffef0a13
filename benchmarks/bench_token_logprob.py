"""token_logprob against eager PyTorch, torch.compile of it and flash-attn's Triton cross entropy.

    python benchmarks/bench_token_logprob.py                  # CUDA: N = 4096, 8192, 16384 x V = 152064, bf16
    python benchmarks/bench_token_logprob.py --device cpu     # CPU: N = 4096 x V = 32000, fp32
    python benchmarks/bench_token_logprob.py --quick --json r.jsonl --png r.png --write RESULTS.md

Cases: forward; forward + entropy; forward + backward of sum(logprob); and forward + backward
with the logits an upstream op's output (where inplace_backward hands their storage back as
the gradient). GB/s counts the bytes that must move at least: forward reads the N x V logits
once; forward + backward reads them twice and writes the gradient once. eager is what a trainer
writes: float32 log_softmax, then gather (and the entropy from the same log-probs). flash_attn is
flash_attn.ops.triton.cross_entropy.cross_entropy_loss (its per-token loss is -logprob; no
entropy), run where flash-attn is installed.
"""

from __future__ import annotations

import torch

import harness
from harness import Case


def eager_logprob(logits, ids):
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def eager_logprob_entropy(logits, ids):
    logp = torch.log_softmax(logits.float(), dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1), ent


def _flash_attn_logprob(logits, ids, inplace_backward=False):
    from flash_attn.ops.triton.cross_entropy import cross_entropy_loss

    return -cross_entropy_loss(logits, ids, inplace_backward=inplace_backward)[0]


def _fn(provider: str, entropy: bool):
    """The provider's logprob (or (logprob, entropy)) function of (logits, ids)."""
    from reasonrl_fast.ops import token_logprob

    if provider == "ours":
        return lambda z, y: token_logprob(z, y, return_entropy=entropy)
    if provider == "ours (inplace_backward)":
        return lambda z, y: token_logprob(z, y, return_entropy=entropy, inplace_backward=True)
    eager = eager_logprob_entropy if entropy else eager_logprob
    if provider == "eager":
        return eager
    if provider == "compile":
        return torch.compile(eager)
    if provider == "flash_attn":
        import flash_attn.ops.triton.cross_entropy  # noqa: F401  (ImportError: not installed)

        return _flash_attn_logprob
    if provider == "flash_attn (inplace_backward)":
        import flash_attn.ops.triton.cross_entropy  # noqa: F401

        return lambda z, y: _flash_attn_logprob(z, y, inplace_backward=True)
    raise ValueError(f"bench_token_logprob: unknown provider {provider!r}")


def _total(out):
    return out.sum() if isinstance(out, torch.Tensor) else sum(o.sum() for o in out)


def _maker(dtype: torch.dtype, kind: str):
    def make(provider: str, size: dict, device: str):
        f = _fn(provider, entropy=kind == "forward + entropy")
        gen = torch.Generator(device=device).manual_seed(0)
        z = torch.randn(size["N"], size["V"], device=device, dtype=dtype, generator=gen)
        y = torch.randint(0, size["V"], (size["N"],), device=device, generator=gen)
        if kind in ("forward", "forward + entropy"):
            return lambda: f(z, y)
        zg = z.requires_grad_()
        # The gradient is dropped after each call, so a call starts from what the previous left.
        if kind == "forward + backward":
            def step():
                _total(f(zg, y)).backward()
                zg.grad = None
            return step

        def step_nonleaf():  # the logits as an upstream op's output
            _total(f(zg * 1.0, y)).backward()
            zg.grad = None
        return step_nonleaf
    return make


def cases(device: str, quick: bool) -> list[Case]:
    """The cases of this op on `device` (one size each with quick)."""
    cuda = device.startswith("cuda")
    dtype = harness.default_dtype(device)
    if cuda:
        sizes = [{"N": 16384, "V": 152064}] if quick else [{"N": n, "V": 152064} for n in (4096, 8192, 16384)]
    else:
        sizes = [{"N": 16, "V": 152064}] if quick else [{"N": 4096, "V": 32000}]
    elt = torch.empty(0, dtype=dtype).element_size()
    once = lambda s: s["N"] * s["V"] * elt  # noqa: E731
    peers = ["ours", "eager", "compile", "flash_attn"]
    no_entropy = {"flash_attn": "no entropy"}
    dt = str(dtype).replace("torch.", "")
    out = [
        Case("token_logprob", "forward", sizes, peers, _maker(dtype, "forward"), dt, bytes_moved=once),
        Case("token_logprob", "forward + entropy", sizes, ["ours", "eager", "compile"],
             _maker(dtype, "forward + entropy"), dt, bytes_moved=once, notes=no_entropy),
        Case("token_logprob", "forward + backward", sizes, peers, _maker(dtype, "forward + backward"), dt,
             bytes_moved=lambda s: 3 * once(s)),
        Case("token_logprob", "fwd + bwd, non-leaf logits", sizes,
             ["ours", "ours (inplace_backward)", "eager", "flash_attn (inplace_backward)"],
             _maker(dtype, "non-leaf"), dt, bytes_moved=lambda s: 3 * once(s)),
    ]
    return out


def main(argv=None) -> list[dict]:
    return harness.op_script_main(__file__, __doc__, cases, "token-logprob", "token_logprob", argv)


if __name__ == "__main__":
    main()
