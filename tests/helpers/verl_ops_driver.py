"""Runs inside the verl 0.9.1 venv (fresh process, WT and a dist-info with our entry point on
PYTHONPATH): imports verl as its workers do, so that verl itself loads the `verl.plugins` entry
point, then compares what got registered and patched with verl's own functions. Prints one JSON
line after the marker: {"checks": [{"name", "ok", "detail"}], "seconds": {...}}.

Usage: python verl_ops_driver.py {plain|patched}
"""

import json
import sys
import time

MODE = sys.argv[1]
checks = []
seconds = {}


def check(name, ok, detail=""):
    checks.append({"name": name, "ok": bool(ok), "detail": str(detail)})


def close(name, ours, ref, atol=1e-5, rtol=1e-5):
    err = (ours.double() - ref.double()).abs().max().item() if ours.numel() else 0.0
    ok = ours.shape == ref.shape and err <= atol + rtol * ref.double().abs().max().item()
    check(name, ok, f"max abs err {err:.3g}, shapes {tuple(ours.shape)} {tuple(ref.shape)}")


t0 = time.monotonic()
import verl  # noqa: E402  (loads the verl.plugins entry points, as in every verl process)

seconds["import_verl"] = time.monotonic() - t0
import numpy as np  # noqa: E402
import torch  # noqa: E402

from verl.trainer.ppo import core_algos  # noqa: E402

import reasonrl_fast.integrations.verl as rv  # noqa: E402

check("plugin module imported by verl's entry-point loading",
      "reasonrl_fast.integrations.verl_plugin" in sys.modules)
check("advantage estimator registered", core_algos.get_adv_estimator_fn(rv.ADV_ESTIMATOR) is rv.grpo_advantage)
check("policy loss registered", core_algos.get_policy_loss_fn(rv.POLICY_LOSS) is rv.flowrl_policy_loss)
rv.register()  # a second registration (another process-level load) changes nothing
check("registration idempotent", core_algos.ADV_ESTIMATOR_REGISTRY[rv.ADV_ESTIMATOR] is rv.grpo_advantage)

# ---- advantages: awkward group sizes (1, 2, 3, 5, 7, 8, 11), shuffled, one constant group
g = torch.Generator().manual_seed(0)
sizes = [1, 2, 3, 5, 7, 8, 11, 4]
uids = np.array([f"prompt-{i}" for i, n in enumerate(sizes) for _ in range(n)], dtype=object)
perm = torch.randperm(len(uids), generator=g).numpy()
uids = uids[perm]
B, T = len(uids), 13
lengths = torch.randint(1, T + 1, (B,), generator=g)
mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
rewards = torch.zeros(B, T)
rewards[torch.arange(B), lengths - 1] = torch.randint(0, 2, (B,), generator=g).float()
rewards += 0.1 * torch.randn(B, T, generator=g) * mask
rewards[uids == "prompt-7"] = 0.0  # a group whose rewards are all equal: std 0
for norm in (True, False):
    ref, _ = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, uids, norm_adv_by_std_in_grpo=norm)
    ours, ret = rv.grpo_advantage(rewards.clone(), mask, uids, norm_adv_by_std_in_grpo=norm)
    close(f"grpo advantages norm_by_std={norm}", ours, ref)
    check(f"grpo returns equal advantages norm_by_std={norm}", torch.equal(ours, ret))
# through verl's own dispatch for registered estimators (config carries the std flag)
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

for norm in (True, False):
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards.clone(), "response_mask": mask},
                               non_tensors={"uid": uids})
    out = compute_advantage(data, adv_estimator=rv.ADV_ESTIMATOR, config=AlgoConfig(norm_adv_by_std_in_grpo=norm))
    ref, _ = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, uids, norm_adv_by_std_in_grpo=norm)
    close(f"verl compute_advantage(adv_estimator={rv.ADV_ESTIMATOR}) norm_by_std={norm}", out.batch["advantages"], ref)

# ---- flowrl policy loss, called as verl.workers.utils.losses.ppo_loss calls it
loss_fn = core_algos.get_policy_loss_fn("flowrl")
Bf, Tf = 6, 9
lp = (-torch.rand(Bf, Tf, generator=g, dtype=torch.float64) * 2).requires_grad_()
old = lp.detach() + 0.05 * torch.randn(Bf, Tf, generator=g, dtype=torch.float64)
refl = lp.detach() + 0.1 * torch.randn(Bf, Tf, generator=g, dtype=torch.float64)
fmask = (torch.arange(Tf)[None, :] < torch.tensor([9, 1, 4, 7, 9, 3])[:, None])
r_hat = torch.randn(Bf, generator=g, dtype=torch.float64)
adv = r_hat[:, None] * fmask
log_z = torch.randn(Bf, generator=g, dtype=torch.float64, requires_grad=True)
try:
    loss_fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=fmask, loss_agg_mode="token-mean",
            config=None, rollout_is_weights=None)
    check("flowrl without log_z refuses", False, "no error")
except ValueError as e:
    check("flowrl without log_z refuses", "log_z" in str(e) and "flowrl_inputs" in str(e), e)
with rv.flowrl_inputs(log_z=log_z, ref_log_prob=refl, beta=15.0, max_is_weight=10.0):
    loss, metrics = loss_fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=fmask,
                            loss_agg_mode="token-mean", config=None, rollout_is_weights=None)
loss.backward()
m = fmask.double()
n = m.sum(-1)
delta = log_z.detach() + (lp.detach() * m).sum(-1) / (n + 1e-8) - 15.0 * r_hat - (refl * m).sum(-1) / (n + 1e-8)
w = torch.clamp(torch.exp(((lp.detach() - old) * m).sum(-1)), max=10.0)
close("flowrl loss = mean_b w delta^2", loss.detach().reshape(()), (w * delta ** 2).mean(), atol=1e-9, rtol=1e-9)
close("flowrl d log_z", log_z.grad, 2 * w * delta / Bf, atol=1e-9, rtol=1e-9)
close("flowrl d log_prob", lp.grad, (2 * w * delta / (Bf * (n + 1e-8)))[:, None] * m, atol=1e-9, rtol=1e-9)
check("flowrl metrics are floats", all(isinstance(v, float) for v in metrics.values()), metrics)

# ---- patched functions
import verl.utils.experimental.torch_functional as exp_F  # noqa: E402
import verl.utils.kernel.linear_cross_entropy as lce  # noqa: E402
import verl.utils.torch_functional as verl_F  # noqa: E402
import verl.workers.engine.fsdp.transformer_impl as fsdp_impl  # noqa: E402

NAMES = ("logprobs_from_logits", "entropy_from_logits", "entropy_from_logits_with_chunking")
if MODE == "patched":
    # the plugin patched at verl's import; transformer_impl was imported after it
    for name in NAMES:
        check(f"verl_F.{name} is ours", getattr(verl_F, name) is getattr(rv, name))
    check("transformer_impl.logprobs_from_logits is ours", fsdp_impl.logprobs_from_logits is rv.logprobs_from_logits)
    check("linear_cross_entropy is ours", lce.linear_cross_entropy is rv.linear_cross_entropy)
    handle = rv.patch()
    check("patch() again returns the active handle", handle is rv._ACTIVE and handle.active)
    handle.undo()
    originals = {name: getattr(verl_F, name) for name in NAMES}
    check("undo restores verl's functions", all(f.__module__ == "verl.utils.torch_functional" for f in originals.values())
          and fsdp_impl.logprobs_from_logits is originals["logprobs_from_logits"]
          and lce.linear_cross_entropy == lce.LinearCrossEntropy.apply)
else:
    originals = {name: getattr(verl_F, name) for name in NAMES}
    orig_lce, orig_fwd = lce.linear_cross_entropy, exp_F.FusedLinearForPPO.forward
    check("no patch without the env var", verl_F.logprobs_from_logits.__module__ == "verl.utils.torch_functional")
    handle = rv.patch()
    check("patch() patches already-imported modules", fsdp_impl.logprobs_from_logits is rv.logprobs_from_logits
          and verl_F.entropy_from_logits is rv.entropy_from_logits and lce.linear_cross_entropy is rv.linear_cross_entropy)
    import verl.workers.rollout.naive.naive_rollout as naive  # noqa: E402  (imported while patched)

    check("a module imported while patched gets ours", naive.logprobs_from_logits is rv.logprobs_from_logits)
    handle.undo()
    check("undo restores the originals exactly",
          all(getattr(verl_F, k) is f for k, f in originals.items())
          and fsdp_impl.logprobs_from_logits is originals["logprobs_from_logits"]
          and naive.logprobs_from_logits is originals["logprobs_from_logits"]
          and lce.linear_cross_entropy is orig_lce and exp_F.FusedLinearForPPO.forward is orig_fwd)
    handle.undo()  # a second undo is harmless

# numbers: ours (through the patched verl names) against verl's originals
orig_fused_forward = exp_F.FusedLinearForPPO.forward
handle = rv.patch()
N, V, H = 37, 101, 24
logits = (3 * torch.randn(N, V, generator=g)).requires_grad_()
labels = torch.randint(0, V, (N,), generator=g)
for tau in (1.0, 0.7):
    for inplace in (False, True):
        x1 = (logits / tau)
        ours = verl_F.logprobs_from_logits(x1, labels, inplace_backward=inplace)
        (ga,) = torch.autograd.grad(ours.sum(), logits)
        x2 = (logits / tau)
        ref = originals["logprobs_from_logits"](x2, labels)
        (gb,) = torch.autograd.grad(ref.sum(), logits)
        close(f"logprobs_from_logits tau={tau} inplace={inplace}", ours, ref)
        close(f"logprobs_from_logits grad tau={tau} inplace={inplace}", ga, gb)
# labels in another shape with one id per logits row, as verl's own test passes them
close("logprobs_from_logits labels [1, N]", verl_F.logprobs_from_logits(logits, labels[None, :]),
      originals["logprobs_from_logits"](logits, labels))
try:
    verl_F.logprobs_from_logits(logits, labels[:-1])
    check("logprobs_from_logits refuses N-1 labels", False, "no error")
except ValueError as e:
    check("logprobs_from_logits refuses N-1 labels", f"{N - 1} labels for {N} rows" in str(e), e)
for name in ("entropy_from_logits", "entropy_from_logits_with_chunking"):
    ours = getattr(verl_F, name)(logits)
    (ga,) = torch.autograd.grad(ours.sum(), logits)
    ref = originals[name](logits)
    (gb,) = torch.autograd.grad(ref.sum(), logits)
    close(name, ours, ref)
    close(f"{name} grad", ga, gb)
    check(f"{name} dtype", ours.dtype == ref.dtype, (ours.dtype, ref.dtype))
hidden = torch.randn(2, 9, H, generator=g, requires_grad=True)
weight = (0.3 * torch.randn(V, H, generator=g)).requires_grad_()
ids = torch.randint(0, V, (2, 9), generator=g)
for tau in (1.0, 0.6):
    lp_ours, ent_ours = lce.linear_cross_entropy(hidden, weight, ids, tau, "none")
    gh, gw = torch.autograd.grad(lp_ours.sum() + 0.5 * ent_ours.sum(), (hidden, weight))
    lp_ref, ent_ref = orig_fused_forward(exp_F.FusedLinearForPPO(), hidden, weight, ids, tau)
    rh, rw = torch.autograd.grad(lp_ref.sum() + 0.5 * ent_ref.sum(), (hidden, weight))
    close(f"linear_cross_entropy logprobs tau={tau}", lp_ours, lp_ref.reshape(-1))
    close(f"linear_cross_entropy entropy tau={tau}", ent_ours, ent_ref.reshape(-1))
    close(f"linear_cross_entropy grads tau={tau}", torch.cat([gh.reshape(-1), gw.reshape(-1)]),
          torch.cat([rh.reshape(-1), rw.reshape(-1)]))
    z = (hidden @ weight.T / tau).reshape(-1, V)
    close(f"linear_cross_entropy vs verl's logprobs_from_logits tau={tau}", lp_ours,
          originals["logprobs_from_logits"](z, ids.reshape(-1)))
    lp_f, ent_f = exp_F.FusedLinearForPPO()(hidden, weight, ids, tau)
    close(f"FusedLinearForPPO (patched) tau={tau}", torch.cat([lp_f.reshape(-1), ent_f.reshape(-1)]),
          torch.cat([lp_ref.reshape(-1), ent_ref.reshape(-1)]))
lp_upper, _ = lce.linear_cross_entropy(hidden, weight, ids, 1.0, "NONE")  # verl lower-cases it
close("linear_cross_entropy reduction='NONE'", lp_upper, lce.linear_cross_entropy(hidden, weight, ids, 1.0, "none")[0])
try:
    lce.linear_cross_entropy(hidden, weight, ids, 1.0, "sum")
    check("linear_cross_entropy refuses reduction='sum'", False, "no error")
except NotImplementedError as e:
    check("linear_cross_entropy refuses reduction='sum'", "reduction" in str(e), e)
handle.undo()

# GSPO and CISPO (grpo.policy_loss) against verl's own registered functions, float64, random
# sizes, a response with no tokens, with and without a rollout weight; each aggregation both
# projects offer (GSPO: the one its paper and verl use). verl's denominators given as ours count
# them (every response, empty or not: `global_batch_size`).
from verl.workers.config import ActorConfig  # noqa: E402

from reasonrl_fast.algos.grpo import grpo_loss  # noqa: E402

gen = torch.Generator().manual_seed(int(time.time()))
for policy, modes in (("gspo", ["seq-mean-token-mean"]),
                      ("cispo", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])):
    for agg in modes:
        for weighted in (False, True):
            B, T = int(torch.randint(3, 9, (1,), generator=gen)), int(torch.randint(5, 23, (1,), generator=gen))
            lo, hi = (3e-4, 4e-4) if policy == "gspo" else (0.2, 0.28)
            old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
            lp0 = old + torch.randn(B, T, generator=gen, dtype=torch.float64) * (1e-3 if policy == "gspo" else 0.3)
            mask = (torch.rand(B, T, generator=gen) < 0.8).double()
            mask[0] = 0  # a response with no tokens
            mask[1, 0] = 1
            adv = torch.randn(B, generator=gen, dtype=torch.float64)
            w = torch.rand(B, T, generator=gen, dtype=torch.float64) * 2 if weighted else None
            config = ActorConfig(strategy="fsdp", clip_ratio_low=lo, clip_ratio_high=hi, rollout_n=1,
                                 ppo_micro_batch_size_per_gpu=1)
            config.global_batch_info.update(dp_size=1, global_batch_size=B, batch_num_tokens=mask.sum())
            lp_ref = lp0.clone().requires_grad_(True)
            ref, ref_metrics = core_algos.get_policy_loss_fn(policy)(
                old, lp_ref, adv.unsqueeze(-1).expand(B, T), mask, agg, config, w)
            ref.backward()
            lp_ours = lp0.clone().requires_grad_(True)
            ours, stats = grpo_loss(lp_ours, old, adv, mask, lo, hi, agg, rollout_weight=w, policy_loss=policy)
            ours.backward()
            name = f"{policy} {agg}{' weighted' if weighted else ''}"
            close(f"{name}: loss", ours.detach().reshape(1), ref.detach().reshape(1), atol=1e-6, rtol=0)
            close(f"{name}: gradient", lp_ours.grad, lp_ref.grad, atol=1e-6, rtol=0)
            # our statistics are float32 means
            check(f"{name}: clip fraction", abs(stats["grpo/clip_frac"] - ref_metrics["actor/pg_clipfrac"]) < 1e-6,
                  (stats["grpo/clip_frac"], ref_metrics["actor/pg_clipfrac"]))

# The entropy bonus (grpo.entropy_coef) as verl's actor adds it (workers/utils/losses.py: the
# policy loss minus entropy_coeff x agg_loss(entropy) in the loss's mode), over each policy loss:
# the loss and its gradients in the log-probs and in the entropy.
for policy, agg in (("vanilla", "token-mean"), ("vanilla", "seq-mean-token-sum"), ("gspo", "seq-mean-token-mean"),
                    ("cispo", "token-mean"), ("cispo", "seq-mean-token-mean")):
    B, T = int(torch.randint(3, 9, (1,), generator=gen)), int(torch.randint(5, 23, (1,), generator=gen))
    lo, hi = (3e-4, 4e-4) if policy == "gspo" else (0.2, 0.28)
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    lp0 = old + torch.randn(B, T, generator=gen, dtype=torch.float64) * (1e-3 if policy == "gspo" else 0.3)
    ent0 = torch.rand(B, T, generator=gen, dtype=torch.float64) * 4
    mask = (torch.rand(B, T, generator=gen) < 0.8).double()
    mask[0] = 0
    mask[1, 0] = 1
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    config = ActorConfig(strategy="fsdp", clip_ratio_low=lo, clip_ratio_high=hi, rollout_n=1,
                         ppo_micro_batch_size_per_gpu=1, entropy_coeff=0.01)
    config.global_batch_info.update(dp_size=1, global_batch_size=B, batch_num_tokens=mask.sum())
    lp_ref, ent_ref = lp0.clone().requires_grad_(True), ent0.clone().requires_grad_(True)
    pg, _ = core_algos.get_policy_loss_fn(policy)(old, lp_ref, adv.unsqueeze(-1).expand(B, T), mask, agg, config)
    ref = pg - config.entropy_coeff * core_algos.agg_loss(ent_ref, mask, agg, **config.global_batch_info)
    ref.backward()
    lp_ours, ent_ours = lp0.clone().requires_grad_(True), ent0.clone().requires_grad_(True)
    # verl's vanilla loss always applies its dual clip (clip_ratio_c, 3 by default)
    dual = config.clip_ratio_c if policy == "vanilla" else None
    ours, _ = grpo_loss(lp_ours, old, adv, mask, lo, hi, agg, clip_ratio_c=dual,
                        policy_loss="clip" if policy == "vanilla" else policy, entropy=ent_ours,
                        entropy_coef=config.entropy_coeff)
    ours.backward()
    name = f"entropy bonus {policy} {agg}"
    close(f"{name}: loss", ours.detach().reshape(1), ref.detach().reshape(1), atol=1e-6, rtol=0)
    close(f"{name}: gradient", lp_ours.grad, lp_ref.grad, atol=1e-6, rtol=0)
    close(f"{name}: entropy gradient", ent_ours.grad, ent_ref.grad, atol=1e-9, rtol=0)
seconds["total"] = time.monotonic() - t0
print("\n@@result@@\n" + json.dumps({"checks": checks, "seconds": seconds}))
