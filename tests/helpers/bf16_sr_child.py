"""Run by test_optim.py with torchao on PYTHONPATH: N AdamW steps at lr 1e-6 on a matrix drawn at
the 0.02 scale of an LLM's weights, each element with a gradient of its own sign and size (so
each AdamW step moves it by about lr the same way), with the optimizer `make_optimizer` gives for
float32 master weights, for bf16 ones, and for bf16 ones with stochastic rounding. Prints one
JSON line: per setting, each element's displacement along its own descent direction (in units
of N x lr), summarised as mean, standard deviation and count, and the optimizer's class; and the
share of elements that round-to-nearest can move at all."""

import json
import os

import torch

from reasonrl_fast.config import load_config
from reasonrl_fast.trainer.optim import make_optimizer

STEPS, LR, SHAPE = 50, 1e-6, (256, 256)
torch.manual_seed(int(os.environ.get("SEED", "0")))
w0 = torch.randn(SHAPE) * 0.02
grad = torch.randn(SHAPE).sign() * torch.rand(SHAPE).add(0.5)  # AdamW's step depends on the sign
plain = load_config(None, [f"optim.lr={LR}", "optim.weight_decay=0.0"])
rounded = load_config(None, [f"optim.lr={LR}", "optim.weight_decay=0.0", "model.dtype=bfloat16",
                             "optim.bf16_stochastic_round=true"])
out = {}
for name, dtype, cfg in [("float32", torch.float32, plain), ("bfloat16", torch.bfloat16, plain),
                         ("bfloat16_sr", torch.bfloat16, rounded)]:
    p = torch.nn.Parameter(w0.to(dtype))
    start = p.detach().double().clone()
    opt = make_optimizer([{"params": [p], "lr": cfg.optim.lr}], cfg, torch.device("cpu"))
    for _ in range(STEPS):
        p.grad = grad.to(p.dtype)
        opt.step()
    along = (start - p.detach().double()) * grad.sign().double() / (STEPS * LR)
    out[name] = {"mean": along.mean().item(), "std": along.std().item(), "n": along.numel(),
                 "changed": (p.detach().double() != start).double().mean().item(),
                 "optimizer": f"{type(opt).__module__}.{type(opt).__name__}"}
# the share of elements whose step (~lr) is above half their bf16 spacing, 2^(floor(log2|w|) - 8):
# the only ones that round-to-nearest can move
out["movable"] = (w0.abs().log2().floor().sub(8).exp2() < LR).double().mean().item()
print(json.dumps(out), flush=True)
