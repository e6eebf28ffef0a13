"""reasonrl_fast.integrations.trl inside TRL 1.16.0.

TRL runs in a cached venv (tests/helpers/venvs.py); three kinds of child process run there,
once per session each:
- tests/helpers/trl_child.py compares the patched functions with TRL's own on fixed inputs
  (values, dtypes, errors, the calls handed to TRL's own code and their one-time warnings),
  trains a tiny Qwen2 with GRPOTrainer for 3 steps under the patch while counting calls into
  torch.ops.reasonrl_fast, then undoes the patch;
- tests/integrations/trl_upstream_tests.py is TRL's own tests of the functions the patch
  replaces, run by the venv's pytest with the patch on and, as the baseline, off;
- tests/helpers/trl_grpo_parity.py trains the tiny GRPO run twice, with and without the patch,
  in fp32 and in bf16 mixed precision, and the logged metrics are compared.
Without the venv (no package registry to build it from) the TRL tests skip and say why.

Measured on the shared 2-core CPU machine, venv cached: the whole file 48 s at light load
(trl_child 6 s, TRL's tests 9 s with the two runs side by side, the parity runs 31 s, fp32 and
bf16 side by side), 128 s with other jobs loading the machine; building the venv the first time
adds about 210 s."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.helpers.venvs import REPO, child_env

STEPS = 3
FP32 = 2e-5  # fp32 log-prob/entropy tolerance (docs/math.md §Token log-prob and entropy)
TIMEOUT = 600


def run_children(cmds: dict[str, list[str]], envs: dict[str, dict]) -> dict[str, tuple]:
    """Run the commands side by side; {name: (returncode, stdout, stderr)}."""
    procs = {name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=envs[name], cwd=str(REPO))
             for name, cmd in cmds.items()}
    out = {}
    try:
        for name, p in procs.items():
            try:
                stdout, stderr = p.communicate(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the TRL child {name} gave no answer within {TIMEOUT} s")
            out[name] = (p.returncode, stdout, stderr)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def answer(name: str, rc: int, stdout: str, stderr: str) -> dict:
    _, marker, text = stdout.rpartition("@@result@@\n")
    if rc != 0 or not marker:
        pytest.fail(f"the TRL child {name} failed (exit {rc}):\n{stdout[-3000:]}\n{stderr[-5000:]}")
    return json.loads(text)


@pytest.fixture(scope="module")
def result(trl_python) -> dict:
    child = str(REPO / "tests" / "helpers" / "trl_child.py")
    (rc, out, err), = run_children({"trl_child": [str(trl_python), child, str(STEPS)]},
                                   {"trl_child": child_env()}).values()
    return answer("trl_child", rc, out, err)


def test_grpo_trains_through_the_ops(result):
    g = result["grpo"]
    assert g["steps"] == STEPS and g["losses_finite"], g
    assert g["ref_model"], "beta > 0 should give a reference model (its head: log-probs only)"
    # The fused head is the only log-prob path GRPOTrainer takes in TRL 1.16: forward (policy
    # with entropy, old/ref log-probs without) and backward must both reach the ops.
    assert g["calls"].get("linear_token_logprob", 0) >= 2 * STEPS, g["calls"]
    assert g["calls"].get("linear_token_logprob_backward", 0) >= STEPS, g["calls"]
    assert g["params_changed"] > 0, "training changed no parameter"
    assert any(s and s > 0 for s in g["reward_std"]), ("no group had differing rewards", g)
    assert all(e is not None and e > 0 for e in g["entropy_logged"]), g["entropy_logged"]


def test_every_bound_name_is_patched(result):
    rebound = set(result["rebound"])
    for name in ("trl.kernels.chunked_logprob.ChunkedLogProbFunction",
                 "trl.kernels.ChunkedLogProbFunction",
                 "trl.trainer.utils._ChunkedLogProbFunction",
                 "trl.trainer.utils.selective_log_softmax",
                 "trl.trainer.utils.entropy_from_logits",
                 "trl.trainer.utils.selective_log_softmax_and_entropy"):
        assert name in rebound, (name, sorted(rebound))


@pytest.mark.parametrize("case", ["head_fp32", "head_fp32_scaled"])
def test_fused_head_matches_trl_fp32(result, case):
    r = result[case]
    assert r["lp"] < FP32 and r["entropy"] < FP32 and r["grad"] < 1e-4, r
    assert r["mean"] < FP32 and not r["mean_requires_grad"], r
    # TRL's dtypes: float32 log-probs, entropy and mean logits; None for what was not asked
    assert r["dtypes"] == ["torch.float32"] * 3 and r["rest_none"], r


@pytest.mark.parametrize("case", ["head_bf16", "head_autocast"])
def test_fused_head_matches_trl_bf16(result, case):
    # Both sides round each bf16 GEMM's logits to bf16, in tiles of different widths: a logit
    # may land one bf16 step (2^-8 relative, |z| / T up to ~14 here) apart. Neither side may be
    # much further than the other from the exact values for the same bf16 inputs.
    r = result[case]
    assert r["lp"] < 0.15 and r["entropy"] < 0.1 and r["grad"] < 0.05, r
    assert r["lp_exact_ours"] <= 2 * r["lp_exact_trl"] + 1e-3, r
    # TRL sums bf16-rounded logits for the mean; the patch takes the mean weight row in float32
    assert r["mean_exact_ours"] <= r["mean_exact_trl"] + FP32, r
    assert r["dtypes"] == ["torch.float32"] * 3 and r["rest_none"], r


def test_model_forward_matches_trl(result):
    r = result["model"]
    assert r["lp"] < FP32 and r["entropy"] < FP32 and r["masked_zero"], r


def test_materialised_logits_match_trl(result):
    r = result["logits"]
    for key in ("sls", "sls_mask", "sls_topk", "entropy", "both_lp", "both_entropy", "sls_grad",
                "sls_float64", "sls_topk_float64", "entropy_float64"):
        assert r[key] < FP32, (key, r)
    # float16/bfloat16 logits (CPU: outside TRL's Triton kernel): TRL's own function answers,
    # in the logits' dtype, bit for bit; float64 stays float64
    for name in ("sls", "sls_topk", "entropy"):
        for dt in ("bfloat16", "float16"):
            assert r[f"{name}_{dt}"] == 0.0, (name, dt, r)
        for dt in ("bfloat16", "float16", "float64"):
            assert r[f"{name}_{dt}_same_dtype"], (name, dt, r)


def test_handed_back_calls_are_trls_and_warn_once(result):
    """Calls the ops cannot answer as TRL does (soft-capping, is_top1, log_sum_sq_probs, a logit
    scale <= 0) give TRL's own outputs, bit for bit, with one warning per kind."""
    r = result["handbacks"]
    assert r["softcap_model"] == 0.0, r
    for key in ("is_top1", "log_sum_sq", "defaults", "scale0", "softcap"):
        assert r[key]["same"], (key, r)
    assert len(r["is_top1"]["new_warnings"]) == 1 and "is_top1" in r["is_top1"]["new_warnings"][0]
    # the same kind (outputs the ops do not compute) is not warned about again
    assert r["log_sum_sq"]["new_warnings"] == [] and r["defaults"]["new_warnings"] == [], r
    scale0 = r["scale0"]["new_warnings"]
    assert len(scale0) == 1 and "logit scale 0.0" in scale0[0], r
    warnings = result["warnings"]
    assert len(warnings) == len(set(warnings)), warnings
    assert any("final_logit_softcapping=30.0" in w for w in warnings), warnings
    assert any("float16/bfloat16 logits" in w for w in warnings), warnings


def test_bad_input_raises_trls_error(result):
    errors = result["errors"]
    for name, (trl_raised, ours_raised) in errors.items():
        assert trl_raised == ours_raised, (name, errors)
    assert sum(e[0] is not None for e in errors.values()) >= 5, errors


def test_patch_twice_and_undo(result):
    assert result["same_handle"], "patch() twice with the same options returns the active handle"
    assert "already patched" in result["other_options"], result["other_options"]
    assert result["restored"] and result["trl_head_after_undo"], "undo left a replacement bound"
    assert result["entropy_false_keeps"] and result["restored_after_with"], result


# --------------------------------------------------------------- TRL's own tests, patched

UPSTREAM = "tests/integrations/trl_upstream_tests.py"
# With the patch on, the runs that assert on TRL's internals (trl_upstream_tests.py says why)
EXPECTED_XFAIL = {"TestChunkedLogProbFunction::test_forward[ops_outputs-1.0]",
                  "TestChunkedLogProbFunction::test_forward[ops_outputs-0.7]",
                  "TestChunkedLogProbFunction::test_bias[ops_outputs-dtype1]"}


def outcomes(junit_xml: str) -> dict[str, tuple[str, str]]:
    """{Class::test[params]: (outcome, message)} from pytest's JUnit XML."""
    out = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rpartition('.')[2]}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", child.get("message", "")
            elif child.tag == "skipped":
                xfail = child.get("type") == "pytest.xfail"
                outcome, message = ("xfailed" if xfail else "skipped"), child.get("message", "")
        out[name] = (outcome, message)
    return out


@pytest.fixture(scope="module")
def upstream(trl_python, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("trl_upstream")
    cmds, envs = {}, {}
    for mode, flag in (("patched", "1"), ("baseline", "0")):
        cmds[mode] = [str(trl_python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "--noconftest", "-o", "addopts=", f"--junitxml={tmp}/{mode}.xml", UPSTREAM]
        envs[mode] = child_env(REASONRL_FAST_TRL_PATCH=flag,
                               REASONRL_FAST_TRL_OPS_CALLS=str(tmp / f"{mode}.json"))
    res = {}
    for mode, (rc, out, err) in run_children(cmds, envs).items():
        if rc not in (0, 1) or not (tmp / f"{mode}.xml").exists():
            pytest.fail(f"TRL's tests ({mode}) did not run (exit {rc}):\n{out[-3000:]}\n"
                        f"{err[-3000:]}")
        res[mode] = {"outcomes": outcomes(str(tmp / f"{mode}.xml")),
                     "ops_calls": json.loads((tmp / f"{mode}.json").read_text()),
                     "tail": out[-3000:]}
    return res


def _count(outcomes: dict, kind: str) -> int:
    return sum(o == kind for o, _ in outcomes.values())


def _expected_skips(outcomes: dict) -> None:
    for name, (o, message) in outcomes.items():
        if o == "skipped":
            # TRL's Triton kernel needs a GPU and triton; two runs read outputs only TRL computes
            expected = name.startswith("TestLogProbEntropy::") or "[ops_outputs" in name
            assert expected, (name, message)


def test_trl_own_tests_pass_unpatched(upstream):
    """The baseline: the port itself is sound (TRL passes its own tests)."""
    o = upstream["baseline"]["outcomes"]
    failed = {n: m for n, (k, m) in o.items() if k in ("failed", "xfailed")}
    assert not failed, (failed, upstream["baseline"]["tail"])
    _expected_skips(o)
    assert _count(o, "passed") >= 85, upstream["baseline"]["tail"]


def test_trl_own_tests_pass_with_the_patch(upstream):
    o, base = upstream["patched"]["outcomes"], upstream["baseline"]["outcomes"]
    failed = {n: m for n, (k, m) in o.items() if k == "failed"}
    assert not failed, (failed, upstream["patched"]["tail"])
    assert {n for n, (k, _) in o.items() if k == "xfailed"} == EXPECTED_XFAIL
    _expected_skips(o)
    assert set(o) == set(base)
    assert _count(o, "passed") == _count(base, "passed") - len(EXPECTED_XFAIL)


def test_the_ops_answer_trls_tests(upstream):
    """The ported tests reach the ops wherever the patch says they compute (float32/float64
    logits, the fused head with the outputs the ops compute) and nowhere else (half-precision
    logits, the head with is_top1 / log_sum_sq_probs / soft-capping: TRL's own code)."""
    calls = {n.split("::", 1)[1]: c for n, c in upstream["patched"]["ops_calls"].items()}
    o = upstream["patched"]["outcomes"]

    def expect_ops(name: str) -> bool:
        if name.startswith("TestChunkedLogProbFunction::"):
            return "[ops_outputs" in name and "-30.0]" not in name
        return not ("dtype2" in name or "dtype3" in name)  # float16, bfloat16

    ran = [n for n, (k, _) in o.items() if k in ("passed", "xfailed")]
    wrong = {n: calls.get(n) for n in ran if (calls.get(n, 0) > 0) != expect_ops(n)}
    assert not wrong, wrong
    assert sum(calls.get(n, 0) > 0 for n in ran) >= 40, calls


# ------------------------------------------------------- patched vs unpatched GRPOTrainer

# Metrics that measure time, not numbers
TIMING = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


@pytest.fixture(scope="module")
def parity(trl_python) -> dict:
    child = str(REPO / "tests" / "helpers" / "trl_grpo_parity.py")
    modes = ("fp32", "bf16")
    res = run_children({m: [str(trl_python), child, m, str(STEPS)] for m in modes},
                       {m: child_env() for m in modes})
    return {m: answer(f"trl_grpo_parity {m}", *res[m]) for m in modes}


def _compare(r: dict, tolerance, run: str = "", steps: int = STEPS) -> dict:
    """{step/metric: (TRL's, patched)} for every metric outside its tolerance."""
    bad = {}
    trl, patched = r[f"{run}trl"], r[f"{run}patched"]
    assert len(trl) == len(patched) == steps, r
    for step, (a, b) in enumerate(zip(trl, patched), 1):
        assert set(a) == set(b), ("the patched trainer logs other metrics", sorted(a), sorted(b))
        for key, x in a.items():
            if key in TIMING or not isinstance(x, (int, float)):
                continue
            if abs(x - b[key]) > tolerance(key, x):
                bad[f"{step}/{key}"] = (x, b[key])
    return bad


def test_patched_grpo_logs_what_trl_logs_fp32(parity):
    r = parity["fp32"]
    assert r["calls"].get("linear_token_logprob", 0) >= 2 * STEPS, r["calls"]
    assert r["grpo_warnings"] == [], r["grpo_warnings"]
    assert not _compare(r, lambda key, x: FP32 * (1 + abs(x))), r


def test_patched_sft_and_kto_log_what_trl_logs(parity):
    """SFT asks the fused head for is_top1 (its mean_token_accuracy): TRL's own head answers,
    with one warning, and the run is TRL's. KTO asks for mean_logits (its logits/* metrics):
    the ops answer, mean_logits beside them."""
    r = parity["fp32"]
    for run in ("sft_", "kto_"):
        assert not _compare(r, lambda key, x: FP32 * (1 + abs(x)), run, steps=2), (run, r)
    assert "mean_token_accuracy" in r["sft_trl"][0] and "logits/chosen" in r["kto_trl"][0], r
    assert r["sft_calls"] == {}, r["sft_calls"]
    assert r["kto_calls"].get("linear_token_logprob_backward", 0) >= 2, r["kto_calls"]
    assert [w for w in r["warnings"] if "is_top1" in w] == r["warnings"][-1:], r["warnings"]


def test_patched_grpo_logs_what_trl_logs_bf16(parity):
    """bf16 mixed precision: each metric within twice plain PyTorch's own error in bf16 (vs
    float64, measured on the same model by the child): the per-token entropy's for `entropy`,
    the per-token log-prob's for `loss` and `kl` (means of functions of log-prob differences
    with slope <= 1 near 0), the gradient's relative error for `grad_norm`; every other metric
    (rewards, lengths, clipping, learning rate) is computed from the same samples, exactly.
    A mean over tokens lies no further from another computation of it than the largest
    per-token difference, hence the per-token errors. They are loose enough that this run
    cannot tell a bf16 head from an fp32 one (the tiny model's logits are small, their rounding
    averages out); TRL's own autocast test (bit for bit, in trl_upstream_tests.py) and
    trl_child's head_autocast case pin the head's compute dtype."""
    r = parity["bf16"]
    err = r["plain_error"]
    assert r["calls"].get("linear_token_logprob", 0) >= 2 * STEPS, r["calls"]
    assert r["warnings"] == [], r["warnings"]

    def tolerance(key, x):
        if key == "entropy":
            return 2 * err["entropy"]
        if key in ("loss", "kl"):
            return 2 * err["lp"]
        if key == "grad_norm":
            return 2 * err["grad_rel"] * abs(x)
        return 1e-6 * (1 + abs(x))

    assert not _compare(r, tolerance), (r, err)


def test_patch_without_trl_says_so():
    """In the project's own environment (no TRL): importing the module works, patch() names
    what is missing."""
    try:
        importlib.import_module("trl")
        pytest.skip("TRL is installed here")
    except ImportError:
        pass
    mod = importlib.import_module("reasonrl_fast.integrations.trl")
    with pytest.raises(ImportError, match="needs TRL installed"):
        mod.patch()
    assert "trl" not in sys.modules
