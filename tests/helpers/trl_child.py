"""Runs inside the TRL venv (tests/helpers/venvs.py): checks reasonrl_fast.integrations.trl
against TRL's own functions on fixed inputs (values, dtypes, errors, and the calls handed to
TRL's own code with their one-time warnings), then trains a tiny GRPO model for a few steps with
the patch applied, counting the calls that reach torch.ops.reasonrl_fast.

Prints one JSON object after the line "@@result@@"; the test asserts on it (this script asserts
nothing, so that every number reaches the test's failure message)."""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import trl.kernels.chunked_logprob as trl_head
from datasets import Dataset
import trl.trainer.utils as trl_utils
from trl import GRPOConfig, GRPOTrainer

from reasonrl_fast.integrations import trl as rf_trl
from reasonrl_fast.models.tiny import char_tokenizer

NAMES = ("ChunkedLogProbFunction", "add_fused_lm_head", "selective_log_softmax",
         "entropy_from_logits", "selective_log_softmax_and_entropy")


class OpCounter(TorchDispatchMode):
    """Counts each torch.ops.reasonrl_fast overload that is dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "reasonrl_fast":
            self.calls[func.name().split("::")[-1].split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


class WarningLog(logging.Handler):
    """The messages logged by reasonrl_fast.integrations.trl from now on."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        logging.getLogger("reasonrl_fast.integrations.trl").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def bindings() -> dict[str, int]:
    """id of every attribute, in every loaded trl module, that holds one of NAMES' objects."""
    out = {}
    for n, m in list(sys.modules.items()):
        if m is None or not (n == "trl" or n.startswith("trl.")):
            continue
        for attr, v in list(vars(m).items()):
            if attr in NAMES or getattr(v, "__name__", None) in NAMES:
                out[f"{n}.{attr}"] = id(v)
    return out


def err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def head_case(dtype, logit_scale, gen, autocast=False):
    """TRL's fused head vs the patched one on the same inputs: outputs (mean_logits included)
    and gradients (with `autocast`: fp32 inputs, both computing under CPU bf16 autocast)."""
    N, H, V = 37, 24, 101
    h0 = torch.randn(N, H, generator=gen).to(dtype)
    w0 = (torch.randn(V, H, generator=gen) / H**0.5 * 3).to(dtype)
    b0 = torch.randn(V, generator=gen).to(dtype)
    y = torch.randint(0, V, (N,), generator=gen)
    gl, ge = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    res = []
    for fn in (trl_original_head, patched_head):
        h, w, b = (t.clone().requires_grad_() for t in (h0, w0, b0))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            lp, ent, *rest = fn.apply(h, w, b, y, 0.7, 32, None, logit_scale,
                                      ("log_probs", "entropy", "mean_logits"))
        ((lp * gl).sum() + (ent * ge).sum()).backward()
        res.append((lp, ent, h.grad, w.grad, b.grad, rest))
    (lp0, e0, *g0, rest0), (lp1, e1, *g1, rest) = res
    # exact values for these (rounded) inputs: how far each side is from them
    z = (h0.double() @ w0.double().T + b0.double()) * logit_scale / 0.7
    if autocast:  # the exact values for the bf16-rounded inputs both sides compute with
        z = (h0.bfloat16().double() @ w0.bfloat16().double().T + b0.bfloat16().double())
        z = z * logit_scale / 0.7
    ref = z.log_softmax(-1).gather(-1, y[:, None])[:, 0]
    mean_ref = z.mean(-1)
    return {"lp": err(lp0, lp1), "entropy": err(e0, e1), "mean": err(rest0[1], rest[1]),
            "mean_exact_trl": err(rest0[1], mean_ref), "mean_exact_ours": err(rest[1], mean_ref),
            "dtypes": [str(t.dtype) for t in (lp1, e1, rest[1])],
            "mean_requires_grad": rest[1].requires_grad,
            "lp_exact_trl": err(lp0, ref), "lp_exact_ours": err(lp1, ref),
            "grad": max(err(a, c) / max(a.double().abs().max().item(), 1e-12)
                        for a, c in zip(g0, g1)),
            "rest_none": rest[0] is None and rest[2] is None}


def logits_cases(handle, gen):
    """selective_log_softmax / entropy_from_logits / selective_log_softmax_and_entropy: TRL's
    original (pair[0]) against the replacement (pair[1])."""
    z = torch.randn(3, 9, 50, generator=gen) * 3
    idx = torch.randint(0, 50, (3, 9), generator=gen)
    idxk = torch.randint(0, 50, (3, 9, 4), generator=gen)
    mask = torch.rand(3, 9, generator=gen) > 0.3
    sls, ent, both = (handle.replacements[n] for n in (
        "selective_log_softmax", "entropy_from_logits", "selective_log_softmax_and_entropy"))
    out = {
        "sls": err(sls[0](z, idx, 0.8), sls[1](z, idx, 0.8)),
        "sls_mask": err(sls[0](z, idx, 1.3, mask), sls[1](z, idx, 1.3, mask)),
        "sls_topk": err(sls[0](z, idxk), sls[1](z, idxk)),
        "entropy": err(ent[0](z), ent[1](z)),
    }
    # half precision: TRL's own function answers (its result is torch's, bit for bit)
    for name, f, args in (("sls", sls, (idx,)), ("sls_topk", sls, (idxk,)), ("entropy", ent, ())):
        for dt in (torch.bfloat16, torch.float16, torch.float64):
            a, b = f[0](z.to(dt), *args), f[1](z.to(dt), *args)
            key = f"{name}_{str(dt).split('.')[-1]}"
            out[key] = err(a, b)
            out[key + "_same_dtype"] = a.dtype == b.dtype == dt
    a, b = both[0](z, idx, True, 0.9, mask), both[1](z, idx, True, 0.9, mask)
    out["both_lp"], out["both_entropy"] = err(a[0], b[0]), err(a[1], b[1])
    # gradient of selective_log_softmax through the logits, masked rows included
    g = []
    for f in sls:
        x = z.clone().requires_grad_()
        f(x, idx, 0.8, mask).sum().backward()
        g.append(x.grad)
    out["sls_grad"] = err(g[0], g[1])
    return out


def tiny_model(tok, seed):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, tie_word_embeddings=False,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    return Qwen2ForCausalLM(cfg)


def under_each_head(model, ids, labels) -> list:
    """The model's fused forward with TRL's head, then with the patched head."""
    outs = []
    for fn in (trl_original_head, patched_head):
        saved = trl_utils._ChunkedLogProbFunction
        trl_utils._ChunkedLogProbFunction = fn
        try:
            outs.append(model(input_ids=ids, labels=labels, fused_lm_head=True))
        finally:
            trl_utils._ChunkedLogProbFunction = saved
    return outs


def model_case(tok):
    """A model's fused forward (add_fused_lm_head), TRL's head vs the patched head."""
    model = tiny_model(tok, 1)
    trl_utils.add_fused_lm_head(model, temperature=0.9, outputs=("log_probs", "entropy"))
    ids = torch.randint(3, len(tok), (2, 12), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[:, :5] = -100
    outs = under_each_head(model, ids, labels)
    return {"lp": err(outs[0].log_probs, outs[1].log_probs),
            "entropy": err(outs[0].entropy, outs[1].entropy),
            "masked_zero": bool((outs[1].log_probs[:, :4] == 0).all())}


def handbacks(tok, warnings):
    """Calls the ops cannot answer as TRL does go to TRL's own head: the same outputs, bit for
    bit, and one warning per kind however many calls."""
    out = {}
    model = tiny_model(tok, 2)
    model.config.final_logit_softcapping = 30.0
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids = torch.randint(3, len(tok), (2, 9), generator=torch.Generator().manual_seed(4))
    outs = under_each_head(model, ids, ids)
    out["softcap_model"] = err(outs[0].log_probs, outs[1].log_probs) + err(outs[0].entropy,
                                                                           outs[1].entropy)
    gen = torch.Generator().manual_seed(6)
    h, w = torch.randn(5, 8, generator=gen), torch.randn(11, 8, generator=gen)
    y = torch.tensor([1, 2, 3, 10, 0])
    for key, args in (("is_top1", (None, 1.0, ("log_probs", "is_top1"))),
                      ("log_sum_sq", (None, 1.0, ("log_probs", "log_sum_sq_probs"))),
                      ("defaults", ()),
                      ("scale0", (None, 0.0, ("log_probs",))),
                      ("softcap", (50.0, 1.0, ("log_probs", "entropy")))):
        before = len(warnings)
        a = trl_original_head.apply(h, w, None, y, 0.8, 32, *args)
        b = patched_head.apply(h, w, None, y, 0.8, 32, *args)
        b2 = patched_head.apply(h, w, None, y, 0.8, 32, *args)
        same = all((x is None and v is None) or (x is not None and v is not None
                                                 and torch.equal(x, v) and torch.equal(v, v2))
                   for x, v, v2 in zip(a, b, b2))
        out[key] = {"same": same, "new_warnings": warnings[before:]}
    return out


def errors():
    """Bad input: the patched functions raise what TRL's raise (the same exception type)."""
    sls = (trl_utils_original["selective_log_softmax"], trl_utils.selective_log_softmax)
    both = (trl_utils_original["selective_log_softmax_and_entropy"],
            trl_utils.selective_log_softmax_and_entropy)
    z, idx = torch.randn(2, 3, 7), torch.randint(0, 7, (2, 3))
    cases = {
        "id_out_of_range": (sls, (z, torch.full((2, 3), 7))),
        "id_negative": (sls, (z, torch.full((2, 3), -1))),
        "temperature_0": (sls, (z, idx, 0.0)),
        "shape_mismatch": (sls, (z, idx[:1])),
        "both_temperature_0": (both, (z, idx, True, 0.0)),
        "both_out_of_range": (both, (z, torch.full((2, 3), 9))),
        "int_logits": (sls, (z.long(), idx)),
    }
    out = {}
    for name, (fns, args) in cases.items():
        raised = []
        for f in fns:
            try:
                f(*args)
                raised.append(None)
            except Exception as e:  # the type is what is compared
                raised.append(type(e).__name__)
        out[name] = raised
    return out


def grpo_run(tok, steps):
    model = tiny_model(tok, 0)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    data = Dataset.from_dict({"prompt": ["1+1=", "2+3=", "7+1=", "4+4="] * 4})

    def reward_digits(completions, **kwargs):
        # about 1 character in 10 of an untrained model's output is a digit: the rewards of a
        # group differ, so the advantages (and the policy gradient) are not all zero
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    with tempfile.TemporaryDirectory() as out_dir:
        # A model given as an object has no path for TRL to load the reference model from
        model.save_pretrained(f"{out_dir}/model")
        tok.save_pretrained(f"{out_dir}/model")
        args = GRPOConfig(output_dir=f"{out_dir}/run", per_device_train_batch_size=4,
                          num_generations=4, max_completion_length=8, max_steps=steps,
                          learning_rate=1e-3, beta=0.04, use_vllm=False, report_to=[],
                          bf16=False, use_cpu=True,
                          logging_steps=1, save_strategy="no", seed=0, temperature=0.9,
                          dataloader_num_workers=0)
        trainer = GRPOTrainer(model=f"{out_dir}/model", reward_funcs=reward_digits, args=args,
                              train_dataset=data, processing_class=tok)
        counter = OpCounter()
        start = time.monotonic()
        with counter:
            trainer.train()
        seconds = time.monotonic() - start
    logs = [r for r in trainer.state.log_history if "loss" in r]
    changed = sum(not torch.equal(before[k], v.detach())
                  for k, v in trainer.model.named_parameters())
    return {"calls": dict(counter.calls), "seconds": seconds, "steps": trainer.state.global_step,
            "losses_finite": all(torch.isfinite(torch.tensor(r["loss"])).item() for r in logs),
            "entropy_logged": [r.get("entropy") for r in logs],
            "reward_std": [r.get("reward_std") for r in logs],
            "params_changed": changed, "ref_model": trainer.ref_model is not None}


def main() -> None:
    global patched_head, trl_original_head, trl_utils_original
    result = {}
    original = bindings()
    trl_utils_original = {n: getattr(trl_utils, n) for n in NAMES[2:]}
    warnings = WarningLog().messages
    tok = char_tokenizer()
    h1 = rf_trl.patch()
    result["same_handle"] = rf_trl.patch() is h1
    try:
        rf_trl.patch(entropy=False)
        result["other_options"] = ""
    except RuntimeError as e:
        result["other_options"] = str(e)
    patched = bindings()
    result["rebound"] = sorted(k for k in original if patched.get(k) != original[k])
    # trl_head.ChunkedLogProbFunction is the replacement now: the original comes from the handle
    trl_original_head, patched_head = h1.replacements["ChunkedLogProbFunction"]
    result["head_is_replaced"] = trl_head.ChunkedLogProbFunction is patched_head
    gen = torch.Generator().manual_seed(0)
    result["head_fp32"] = head_case(torch.float32, 1.0, gen)
    result["head_fp32_scaled"] = head_case(torch.float32, 0.5, gen)
    result["head_bf16"] = head_case(torch.bfloat16, 1.0, gen)
    result["head_autocast"] = head_case(torch.float32, 1.0, gen, autocast=True)
    result["logits"] = logits_cases(h1, gen)
    result["model"] = model_case(tok)
    result["handbacks"] = handbacks(tok, warnings)
    result["errors"] = errors()
    result["grpo"] = grpo_run(tok, int(sys.argv[1]))
    h1.undo()
    h1.undo()  # a second undo does nothing
    result["restored"] = bindings() == original
    result["trl_head_after_undo"] = (trl_utils._ChunkedLogProbFunction
                                     is trl_head.ChunkedLogProbFunction is trl_original_head)
    # A patch in a with block is undone at its end, and a fresh patch works after an undo
    with rf_trl.patch(entropy=False) as h2:
        result["entropy_false_keeps"] = trl_utils.entropy_from_logits is h1.replacements[
            "entropy_from_logits"][0]
    result["restored_after_with"] = bindings() == original and not h2.active
    result["warnings"] = warnings
    print("@@result@@\n" + json.dumps(result))


if __name__ == "__main__":
    main()
