"""The benchmark harness on CPU at tiny sizes, and every benchmark script's smoke run in the tier
its needs give it (SMOKE says which test runs which script): the per-op scripts' `--device cpu
--quick`, gpu_check.py on CPU (its GPU steps skipped for want of CUDA, everything else for real,
once with test files that fail, hang and crash), `bench_update.py --smoke`, `bench_ops.py --quick`
and `bench_fused_lm_head.py --smoke` as concurrent subprocesses with one thread each (heavy:
about a minute on the 2-core development machine under load); the sandbox, GenRM server, checkpoint
and reward benchmarks' `--smoke` (proc, a few seconds each); the scripts that train on tiny
settings (e2e); those that need another project's venv (xproj). bench_rollout.py's figures,
RESULTS.md section and process-tree memory are also checked on made-up runs."""

import gc
import json
import math
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import weakref

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, BENCH)

import harness  # noqa: E402
from harness import Case  # noqa: E402
from reasonrl_fast import ops  # noqa: E402
from tests.helpers.train import TINY, sft_cache  # noqa: E402

pytestmark = pytest.mark.proc  # each benchmark script runs in a child process

SCRIPTS = ["token_logprob", "linear_token_logprob", "group_advantage", "tb_loss", "masked_mean"]
DIRECT = [s for s in SCRIPTS if s != "tb_loss"]  # tb_loss runs under gpu_check's dry run

# Every script in benchmarks/ and the test that runs it (its tier: the test's marks). A script that
# imports the package is run here, or it rots unseen; a new one gets its line and its smoke run.
SMOKE = {
    **{f"bench_{name}.py": "test_each_script_runs_quick_on_cpu_with_ours_and_eager (heavy)" for name in SCRIPTS},
    "gpu_check.py": "test_gpu_check_dry_run_writes_its_results_file (heavy)",
    "bench_update.py": "test_update_bench_smoke_measures_every_setting (heavy)",
    "bench_ops.py": "test_ops_bench_quick_writes_the_cpu_table (heavy)",
    "bench_fused_lm_head.py": "test_fused_lm_head_bench_smoke_measures_both_variants (heavy)",
    "bench_sandbox.py": "test_sandbox_bench_smoke (proc)",
    "bench_genrm_server.py": "test_genrm_server_bench_smoke_writes_its_section_and_figure (proc)",
    "bench_checkpoint.py": "test_checkpoint_bench_smoke (proc)",
    "bench_transport.py": "test_transport_bench_smoke (proc)",
    "bench_rewards.py": "test_rewards_bench_smoke_writes_its_section (proc)",
    "bench_sequence_parallel.py": "test_sequence_parallel_bench_smoke_checks_the_gradients (proc)",
    "hang_reward.py": "tests/trainer/test_rewards_in_loop.py (e2e, through tests/helpers/faulty_rewards.py)",
    "gpu_smoke.py": "test_gpu_smoke_runs_a_trainer_step_on_cpu (e2e)",
    "plan_truth.py": "test_plan_truth_smoke_sets_a_cpu_run_beside_the_planner (e2e)",
    "gpu_step.py": "test_gpu_step_runs_a_timed_step_on_cpu (e2e)",
    "profile_trainer.py": "test_profile_trainer_smoke_profiles_a_worker_and_the_driver (e2e)",
    "bench_algos.py": "test_algos_bench_on_tiny_settings_writes_its_section_and_figure (e2e)",
    "bench_async.py": "test_async_bench_on_tiny_settings_writes_its_section (e2e)",
    "latency_reward.py": "bench_async.py's reward-latency case (test_async_bench_on_tiny_settings_writes_its_section)",
    "latency_genrm.py": "bench_async.py's GenRM-latency case (test_async_bench_runs_fapo_against_a_late_genrm)",
    "bench_diversity.py": "test_diversity_bench_on_tiny_settings_writes_its_section_and_figure (e2e)",
    "bench_rollout.py": "test_rollout_bench_on_tiny_settings_runs_hf_and_vllm (xproj)",
    "bench_vs_trl.py": "test_vs_trl_bench_smoke_runs_both_trainers (xproj)",
    "bench_vllm_tp.py": "test_vllm_tp_bench_smoke_runs_every_layout (xproj)",
    "vs_trl_task.py": "bench_vs_trl.py's and profile_trainer.py's runs",
    "vs_trl_trl.py": "bench_vs_trl.py's run (xproj)",
    # No package import: it runs examples/fapo_end_to_end.sh, which tests/test_examples.py runs (e2e),
    # and reads that script's outputs.
    "bench_fapo_loop.py": "tests/test_examples.py::test_fapo_end_to_end (e2e), the script it runs",
    # imported by the scripts above (and by these tests)
    **{name: "imported by the scripts" for name in ("harness.py", "results_md.py", "checkout.py", "proc_tree.py")},
}


BAD_TESTS = """
import os, signal, time
def test_passes(): pass
def test_fails(): assert 1 == 2, "one is not two"
def test_hangs(): time.sleep(600)
def test_crashes(): os.kill(os.getpid(), signal.SIGSEGV)
"""


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        x for x in (ROOT, os.environ.get("PYTHONPATH")) if x))


# All the scripts together, started at once: about a minute on 2 cold cores. One that is still running
# at this limit is killed and named by the tests that read it; the others' results stand.
SCRIPTS_LIMIT_S = 240


def _start(cmd, log):
    """cmd in a session of its own (so its children can be killed with it), writing into `log`:
    a pipe that nobody reads while another process is awaited would fill and stall it."""
    with open(log, "w") as f:
        return subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True), log


def _collect(procs, limit_s):
    """{name: (exit status, output)} of every {name: (process, log)}, within one deadline for all
    of them. A process past it is killed with its children; its status is then -SIGKILL and its
    output ends with a line that says so, so the test that reads it fails naming it instead of
    the fixture erroring every test."""
    deadline = time.monotonic() + limit_s
    out = {}
    for name, (p, log) in procs.items():
        note = ""
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            note = f"\n[{name}: still running {limit_s} s after the start; killed with its children]\n"
        with open(log, errors="replace") as f:
            out[name] = (p.returncode, f.read() + note)
    return out


@pytest.fixture(scope="module")
def script_runs(tmp_path_factory):
    """Every per-op script's quick CPU run and gpu_check's dry run, started together; each one's
    exit status and output (see `_collect`)."""
    tmp = tmp_path_factory.mktemp("bench")
    procs = {}

    def start(name, cmd):
        procs[name] = _start(cmd, tmp / f"{name}.log")

    for name in DIRECT:
        cmd = [sys.executable, os.path.join(BENCH, f"bench_{name}.py"), "--device", "cpu", "--quick",
               "--providers", "ours,eager", "--reps", "1", "--json", str(tmp / f"{name}.jsonl")]
        if name == "group_advantage":  # also the path where each provider runs in its own process
            cmd += ["--isolate", "--png", str(tmp / "ga.png")]
        start(name, cmd)
    (tmp / "RESULTS.md").write_text("# Results\n\n<!-- ops-cpu:begin -->\nkept\n<!-- ops-cpu:end -->\n")
    (tmp / "UPDATE.md").write_text("# Results\n\n<!-- ops-cpu:begin -->\nkept\n<!-- ops-cpu:end -->\n")
    start("update", [sys.executable, os.path.join(BENCH, "bench_update.py"), "--smoke", "--json",
                     str(tmp / "update.json"), "--write", str(tmp / "UPDATE.md")])
    start("ops", [sys.executable, os.path.join(BENCH, "bench_ops.py"), "--quick", "--providers", "ours,eager",
                  "--reps", "1", "--write", str(tmp / "OPS.md"), "--json", str(tmp / "ops.jsonl")])
    start("fused_lm_head", [sys.executable, os.path.join(BENCH, "bench_fused_lm_head.py"), "--smoke"])
    start("gpu_check", [sys.executable, os.path.join(BENCH, "gpu_check.py"), "--device", "cpu", "--no-build",
                        "--skip-tests", "--no-smoke", "--quick", "--benchmarks", "tb_loss", "--providers",
                        "ours,eager", "--out", str(tmp / "check"), "--write", str(tmp / "RESULTS.md")])
    # The check as a GPU machine runs it, on CPU: the GPU steps are skipped for want of CUDA and
    # the rest runs; the op tests replaced by a file whose tests fail, hang and crash.
    (tmp / "test_bad.py").write_text(BAD_TESTS)
    start("gpu_check_cuda", [sys.executable, os.path.join(BENCH, "gpu_check.py"), "--quick", "--benchmarks",
                             "tb_loss", "--out", str(tmp / "cuda"), "--tests", str(tmp / "test_bad.py"),
                             "--per-test", "8", "--workers", "2"])
    return tmp, _collect(procs, SCRIPTS_LIMIT_S)


# --- the harness in this process ---------------------------------------------------------------

def test_measure_returns_a_positive_median_and_rejects_no_reps():
    x = torch.randn(256, 256)
    assert harness.measure(lambda: x @ x, "cpu", reps=3, warmup=1) > 0
    with pytest.raises(ValueError, match="reps"):
        harness.measure(lambda: None, "cpu", reps=0)


def test_peak_memory_counts_what_a_call_allocates():
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("no /proc/self/clear_refs")
    held = []
    mb = harness.peak_memory_mb(lambda: held.append(torch.ones(64 * 2**20 // 4)), "cpu")
    assert 50 < mb < 200, mb
    assert harness.peak_memory_mb(lambda: None, "cpu") < 20


def test_peak_memory_frees_old_garbage_first_and_collects_none_during_the_call():
    # Cyclic garbage (an exception's traceback holding tensors, say) freed by a collection
    # inside the call would cancel what the call allocates: the count read 0.
    class Cycle:
        def __init__(self):
            self.me = self

    garbage = Cycle()
    alive = weakref.ref(garbage)
    del garbage
    seen = []
    harness.peak_memory_mb(lambda: seen.append((alive() is None, gc.isenabled())), "cpu")
    assert seen == [(True, False)]
    assert gc.isenabled()


@pytest.mark.proc
def test_peak_memory_counts_memory_the_allocator_reuses():
    # In a child: with glibc's mmap threshold raised, a freed 128 MB block below a live one
    # stays in the heap, where the 64 MB tensor then lands on pages that are already resident
    # unless the harness trims first.
    code = ("import ctypes, sys; sys.path.insert(0, 'benchmarks'); import harness, torch\n"
            "libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p\n"
            "libc.mallopt(-3, 512 << 20)  # M_MMAP_THRESHOLD\n"
            "x = torch.ones(128 * 2**20 // 4); pin = libc.malloc(1 << 16); del x; held = []\n"
            "print(harness.peak_memory_mb(lambda: held.append(torch.ones(64 * 2**20 // 4)), 'cpu'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, check=True).stdout
    if out.strip() == "None":
        pytest.skip("no /proc/self/clear_refs")
    assert 50 < float(out) < 200, out


def test_rates_are_positive():
    assert harness.copy_bandwidth("cpu", nbytes=1 << 20, reps=2) > 0
    assert harness.matmul_rate("cpu", torch.float32, n=64, reps=2) > 0


def _case():
    def make(provider, size, device):
        if provider == "missing":
            raise ImportError("no module named 'nowhere'", name="nowhere")
        x = torch.randn(size["N"], device=device)
        if provider == "oom":
            def oom():
                raise RuntimeError("CUDA out of memory. Tried to allocate 1 GiB")
            return oom
        if provider == "eager":
            return lambda: (x * 2).sum()
        return lambda: x.sum()
    return Case("toy", "forward", [{"N": 1000}, {"N": 4000}], ["ours", "eager", "missing", "oom"], make,
                bytes_moved=lambda s: 4 * s["N"], flops=lambda s: s["N"])


def test_a_missing_or_failing_provider_is_recorded_and_the_sweep_goes_on():
    rows = harness.run_cases([_case()], "cpu", reps=2, warmup=1,
                             rates={"copy_gbps": 1.0, "matmul_tflops": 1.0, "matmul_dtype": "float32"}, log=False)
    assert len(rows) == 8
    by = {(r["provider"], r["size"]["N"]): r for r in rows}
    for n in (1000, 4000):
        assert by[("missing", n)]["status"] == "not installed (nowhere)" and by[("missing", n)]["ms"] is None
        assert by[("oom", n)]["status"] == "failed: out of memory"
        ours = by[("ours", n)]
        assert ours["status"] == "ok" and ours["ms"] > 0
        assert ours["gbps"] == pytest.approx(4 * n / (ours["ms"] / 1e3) / 1e9)
        assert ours["pct_copy_bw"] == pytest.approx(100 * ours["gbps"])
        assert ours["vs_eager"] == pytest.approx(by[("eager", n)]["ms"] / ours["ms"])


def test_the_table_round_trips_without_touching_other_sections(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# R\n\n<!-- a:begin -->\nA\n<!-- a:end -->\n\nprose\n\n<!-- b:begin -->\nB\n<!-- b:end -->\n")
    rows = harness.run_cases([_case()], "cpu", reps=1, warmup=0, log=False)
    info = harness.env_info("cpu")
    for _ in range(2):  # the second write replaces the first
        harness.write_markdown(str(path), "toy", "Toy", rows, {}, info, "cmd")
    text = path.read_text()
    assert text.count("<!-- toy:begin -->") == 1 and text.count("| toy | forward |") == 8
    assert "<!-- a:begin -->\nA\n<!-- a:end -->" in text and "prose" in text
    assert "<!-- b:begin -->\nB\n<!-- b:end -->" in text
    assert "not installed (nowhere)" in text and info["torch"] in text


def test_jsonl_round_trips_and_a_bad_line_is_named(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = harness.run_cases([_case()], "cpu", reps=1, warmup=0, log=False)
    harness.write_jsonl(str(path), rows, {"torch": "x"}, {"copy_gbps": 1.0})
    envs, back = harness.read_jsonl(str(path))
    assert envs[0]["copy_gbps"] == 1.0 and [r["provider"] for r in back] == [r["provider"] for r in rows]
    with open(path, "a") as f:
        f.write("{oops\n")
    with pytest.raises(ValueError, match=r"rows.jsonl:10"):
        harness.read_jsonl(str(path))


def test_plot_writes_a_png(tmp_path):
    rows = harness.run_cases([_case()], "cpu", reps=1, warmup=0, log=False)
    out = harness.plot(rows, str(tmp_path / "toy.png"), "toy")
    assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert harness.plot([r for r in rows if r["status"] != "ok"], str(tmp_path / "none.png")) is None


# --- the scripts ---------------------------------------------------------------------------------


def test_collect_names_a_process_past_the_deadline_and_keeps_the_others(tmp_path):
    # the slow one's child would outlive a kill of the parent alone
    slow = "import subprocess, sys, time; " \
           "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "print('child', c.pid, flush=True); time.sleep(60)"
    procs = {"quick": _start([sys.executable, "-c", "print('done')"], tmp_path / "quick.log"),
             "slow": _start([sys.executable, "-c", slow], tmp_path / "slow.log"),
             "fails": _start([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "fails.log")}
    t0 = time.monotonic()
    out = _collect(procs, 3)
    assert time.monotonic() - t0 < 10
    assert out["quick"] == (0, "done\n") and out["fails"][0] == 3
    rc, text = out["slow"]
    assert rc == -signal.SIGKILL and text.startswith("child "), text
    assert text.endswith("[slow: still running 3 s after the start; killed with its children]\n"), text
    child = int(text.split()[1])

    def alive():
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
        except FileNotFoundError:
            return False
    for _ in range(50):
        if not alive():
            break
        time.sleep(0.1)
    assert not alive(), f"the slow process's child {child} outlived it"

@pytest.mark.heavy  # nine scripts at once
@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_runs_quick_on_cpu_with_ours_and_eager(script_runs, name):
    tmp, out = script_runs
    rc, text = out[name if name in DIRECT else "gpu_check"]
    assert rc == 0, text[-2000:]
    if name in DIRECT:
        envs, rows = harness.read_jsonl(str(tmp / f"{name}.jsonl"))
    else:
        data = json.loads((tmp / "check" / "gpu_check.json").read_text())
        envs, rows = data["per_benchmark_rates"], data["rows"]
    assert envs and envs[0]["device"] == "cpu" and envs[0]["copy_gbps"] > 0
    providers = {r["provider"] for r in rows if r["status"] == "ok" and r["ms"] > 0}
    assert {"ours", "eager"} <= providers, rows
    for p in ("ours", "eager"):  # the printed table has a row for each
        assert any(f"| {name} |" in line and f"| {p} " in line for line in text.splitlines()), text
    if name == "group_advantage":
        assert open(tmp / "ga.png", "rb").read(4) == b"\x89PNG"


@pytest.mark.heavy  # nine scripts at once
def test_gpu_check_dry_run_writes_its_results_file(script_runs):
    tmp, out = script_runs
    rc, text = out["gpu_check"]
    assert rc == 0, text[-2000:]
    md = (tmp / "check" / "gpu_check.md").read_text()
    data = json.loads((tmp / "check" / "gpu_check.json").read_text())
    assert data["env"]["torch"] == torch.__version__ and data["env"]["cpu_count"] == os.cpu_count()
    assert data["rates"]["copy_gbps"] > 0 and data["rates"]["matmul_tflops"] > 0
    steps = {s["name"]: s["status"] for s in data["steps"]}
    assert steps == {"build": "skipped: --no-build", "import": "ok", "errpath": "ok", "tests": "skipped: --skip-tests",
                     "smoke": "skipped: --no-smoke", "rl-step": "skipped: no CUDA", "plan-truth": "skipped: no CUDA",
                     "bench tb_loss": "ok"}
    assert {r["provider"] for r in data["rows"]} == {"ours", "eager"}
    assert torch.__version__ in md and "| bench tb_loss | ok |" in md and "| tb_loss | forward + backward |" in md
    results = (tmp / "RESULTS.md").read_text()
    assert "<!-- ops-cpu:begin -->\nkept\n<!-- ops-cpu:end -->" in results
    assert "<!-- ops-gpu:begin -->" in results and "| tb_loss |" in results


@pytest.mark.heavy  # nine scripts at once
def test_gpu_check_without_cuda_runs_every_other_step_and_names_every_failure(script_runs):
    tmp, out = script_runs
    rc, text = out["gpu_check_cuda"]
    assert rc == 1, text[-3000:]  # the planted failures
    d = tmp / "cuda"
    assert sorted(os.listdir(d)) == ["errpath.json", "gpu_check.json", "gpu_check.log", "gpu_check.md", "junit.xml"]
    data = json.loads((d / "gpu_check.json").read_text())
    steps = {s["name"]: s for s in data["steps"]}
    assert list(steps) == ["build", "import", "errpath", "tests", "smoke", "rl-step", "plan-truth", "bench tb_loss"]
    for name in ("build", "smoke", "rl-step", "plan-truth", "bench tb_loss"):
        assert steps[name]["status"].startswith("skipped: no CUDA"), steps[name]
    assert steps["import"]["status"] == "ok" and steps["errpath"]["status"] == "ok"
    assert [r["status"] for r in steps["errpath"]["results"]] == ["ok", "skipped"]
    assert steps["tests"]["status"].startswith("failed") and steps["tests"]["limit"] > 0
    # what was checked, and with what
    facts = data["facts"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert facts["git"]["commit"] == head and isinstance(facts["git"]["dirty"], bool)
    assert facts["toolchain"]["cxx"] and facts["toolchain"]["loaded_libstdcxx"]
    assert "libstdc++.so.6" in facts["import"]["elf"]["needed"] and facts["import"]["elf"]["defines_cxa_throw"] is False
    assert data["env"]["torch"] == torch.__version__
    # every failure named: the failing test, the hung one, the crashed one
    md = (d / "gpu_check.md").read_text()
    assert head in md and "## What failed" in md
    assert "test_fails" in md and "one is not two" in md
    assert "test_hangs" in md and "still running after" in md
    assert "test_crashes" in md and "Segmentation fault" in md
    assert "test_passes" not in md.split("## What failed")[1]
    log = (d / "gpu_check.log").read_text()
    assert "PASSED" in log and "test_bad.py::test_passes" in log  # -v: every test by name


@pytest.mark.heavy  # nine scripts at once
def test_update_bench_smoke_measures_every_setting(script_runs):
    import bench_update

    tmp, out = script_runs
    rc, text = out["update"]
    assert rc == 0, text[-2000:]
    rows = {r["setting"]: r for r in json.loads((tmp / "update.json").read_text())["rows"]}
    assert list(rows) == list(bench_update.SETTINGS)
    pad, packed, one = rows["padded"], rows["packed"], rows["packed, one row"]
    # one packed row holds exactly the real tokens, rows of the longest sequence a few more (their
    # tails), padded ones more still; a budget cuts into several forwards
    assert one["positions"] == one["tokens"] == pad["tokens"] <= packed["positions"] < pad["positions"]
    assert pad["forwards"] == packed["forwards"] == one["forwards"] == 1
    assert rows["padded, budget"]["forwards"] > 1 and rows["packed, budget"]["forwards"] > 1
    assert pad["tokens"] <= rows["padded, budget"]["positions"] < pad["positions"]
    for r in rows.values():
        assert len(r["times_s"]) == 2 and all(t > 0 for t in r["times_s"]) and r["peak_mib"] is not None
    # checkpointing holds fewer bytes for the backward than the same layout without it
    assert rows["packed, checkpointing"]["saved_largest_mib"] < packed["saved_largest_mib"] / 2
    assert rows["packed, budget, checkpointing"]["saved_all_mib"] < rows["packed, budget"]["saved_all_mib"] / 2
    md = (tmp / "UPDATE.md").read_text()
    assert "<!-- ops-cpu:begin -->\nkept\n<!-- ops-cpu:end -->" in md
    assert md.count("<!-- update-layouts-cpu:begin -->") == 1 and "| packed, budget, checkpointing | " in md


@pytest.mark.heavy  # nine scripts at once
def test_ops_bench_quick_writes_the_cpu_table(script_runs):
    tmp, out = script_runs
    rc, text = out["ops"]
    assert rc == 0, text[-2000:]
    _, rows = harness.read_jsonl(str(tmp / "ops.jsonl"))
    ok = {(r["op"], r["provider"]) for r in rows if r["status"] == "ok" and r["ms"] > 0}
    ours = [f"ours [{c}]" for c in ops.cpu_capabilities()]  # once per CPU capability this CPU has
    assert ok == {(op, p) for op in ("token_logprob", "group_advantage", "tb_loss", "masked_mean")
                  for p in (*ours, "eager")}, rows
    md = (tmp / "OPS.md").read_text()
    assert md.count("<!-- ops-cpu:begin -->") == 1 and "| masked_mean | forward + backward |" in md


@pytest.mark.heavy  # nine scripts at once
def test_fused_lm_head_bench_smoke_measures_both_variants(script_runs):
    _, out = script_runs
    rc, text = out["fused_lm_head"]
    assert rc == 0, text[-2000:]
    # one row per table, each from an unfused and a fused child process
    assert "| 32 | 512 | 0.0 |" in text and "| 32 | 99 | 0.0 |" in text, text[-2000:]


def test_plan_truth_sets_each_phase_beside_the_planner_terms_it_covers():
    import plan_truth

    g = plan_truth.GIB
    terms = [{"name": "policy parameters", "rollout": 1.0, "update": 1.0},
             {"name": "gradients", "rollout": 0.0, "update": 1.0},
             {"name": "AdamW states (2)", "rollout": 2.0, "update": 2.0},
             {"name": "hf rollout copy", "rollout": 0.5, "update": 0.5},
             {"name": "hf rollout KV cache", "rollout": 0.25, "update": 0.0},
             {"name": "weight sync buckets", "rollout": 0.5, "update": 0.0},
             {"name": "activations", "rollout": 0.0, "update": 1.0},
             {"name": "a term of the future", "rollout": 0.1, "update": 0.1}]
    held = {"policy parameters": 1 * g, "AdamW states (2)": 2 * g, "hf rollout copy": g // 2, "reference model": 0}
    steps = [{"step": 1, "generate": {"base": int(3.0 * g), "peak": int(3.2 * g)},
              "update": {"base": int(3.0 * g), "peak": int(6.5 * g)}},  # the first update allocates AdamW's states
             {"step": 2, "generate": {"base": int(3.6 * g), "peak": int(3.9 * g)},
              "update": {"base": int(3.6 * g), "peak": int(6.0 * g)},
              "sync": {"base": int(3.6 * g), "peak": int(4.0 * g)}}]
    phases = plan_truth.phase_peaks(steps)
    assert phases["update"] == {"base": int(3.6 * g), "peak": int(6.0 * g), "max_peak": int(6.5 * g)}
    res = plan_truth.compare(terms, held, int(3.6 * g), phases)
    rows = {r["term"]: r for r in res["rows"]}
    assert "reference model" not in rows  # not planned: no row, whatever is held
    assert rows["AdamW states (2)"]["ratio"] == pytest.approx(1.0)
    assert rows["not in a held tensor (at rest)"]["measured_gib"] == pytest.approx(0.1, abs=1e-6)
    # each phase's own terms against what the phase adds in the steady (last) step
    assert rows["update: gradients, activations"]["planned_gib"] == 2.0
    assert rows["update: gradients, activations"]["measured_gib"] == pytest.approx(2.4, abs=1e-6)
    assert rows["generate: hf rollout KV cache"]["measured_gib"] == pytest.approx(0.3, abs=1e-6)
    assert rows["a term of the future"]["measured_gib"] is None  # shown, not dropped
    # the planner's rollout phase covers the sync; its update phase is the highest update peak
    roll, upd = res["phases"]["rollout"], res["phases"]["update"]
    assert roll["planned_gib"] == pytest.approx(4.35) and roll["measured_gib"] == pytest.approx(4.0, abs=1e-6)
    assert roll["pass"]  # 0.92
    assert upd["planned_gib"] == pytest.approx(5.6) and upd["measured_gib"] == pytest.approx(6.5, abs=1e-6)
    assert not upd["pass"]  # 1.16: past 15 %
    md = plan_truth.markdown(res)
    assert "| **rollout phase, total** | 4.350 | 4.000 | 0.920 | PASS (within 15%) |" in md
    assert "| **update phase, total** | 5.600 | 6.500 | 1.161 | FAIL (within 15%) |" in md
    assert plan_truth.finite(res) and not plan_truth.finite({"x": [1.0, float("nan")]})


def test_gpu_check_rejects_an_unknown_benchmark():
    r = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_check.py"), "--benchmarks", "nope"],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown nope" in r.stderr


def test_a_step_past_its_limit_is_killed_and_one_past_the_budget_is_skipped(monkeypatch):
    import gpu_check

    hang = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    step = gpu_check.run_step("hang", hang, _env(), timeout=3)
    # SIGINT first (pytest still writes its summary and junit XML then), so Python's traceback
    assert step["status"] == "timed out after 3 s" and step["seconds"] < 20 and step["tail"][0] == "started"
    assert "KeyboardInterrupt" in step["tail"][-1]
    # a step that ignores SIGINT is killed after the grace period
    monkeypatch.setattr(gpu_check, "INTERRUPT_GRACE_S", 1.0)
    deaf = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "print('deaf', flush=True); time.sleep(60)"]
    step = gpu_check.run_step("deaf", deaf, _env(), timeout=2)
    assert step["status"] == "timed out after 2 s" and step["seconds"] < 15 and step["rc"] == -9
    failing = [sys.executable, "-c", "import sys; print('1 failed, 2 passed in 0.1s'); sys.exit(3)"]
    step = gpu_check.run_step("tests", failing, _env(), timeout=60)
    assert step["status"] == "failed (exit 3)" and gpu_check.test_summary(step["tail"]) == "1 failed, 2 passed in 0.1s"
    monkeypatch.setattr(gpu_check, "_DEADLINE", 0.0)
    assert gpu_check.run_step("late", hang, _env(), timeout=60)["status"] == "skipped: budget spent"


def test_a_step_that_exits_between_two_selects_keeps_its_last_lines(monkeypatch):
    import gpu_check

    class Late(selectors.DefaultSelector):
        def select(self, timeout=None):  # under load: every wait times out, the child exits meanwhile
            return []

    monkeypatch.setattr(gpu_check.selectors, "DefaultSelector", Late)
    done = [sys.executable, "-c", "import sys; print('started'); print('1 failed, 2 passed in 0.1s'); sys.exit(3)"]
    step = gpu_check.run_step("tests", done, _env(), timeout=60)
    assert step["status"] == "failed (exit 3)" and step["tail"] == ["started", "1 failed, 2 passed in 0.1s"]


# --- bench_diversity.py's log-partition of FlowRL's residual --------------------------------

def test_log_partition_is_the_normaliser_of_the_length_normalised_target():
    import bench_diversity

    import torch

    from reasonrl_fast.ops import group_advantage

    for beta, tokens, p, right in ((0.0, 26, 0.64, 7), (1.0, 26, 0.64, 7), (15.0, 26, 0.3, 4), (5.0, 3.5, 0.9, 1)):
        r = torch.tensor([1.0] * right + [0.0] * (8 - right), dtype=torch.float64)
        adv = group_advantage(r, torch.zeros(8, dtype=torch.long), eps=0.0).double()
        hi, lo = adv[0].item(), adv[-1].item()
        # sum over right and wrong answers of pi_ref * exp(n beta r_hat), as the shares p and 1 - p
        direct = torch.logsumexp(torch.tensor([math.log(p) + tokens * beta * hi,
                                               math.log(1 - p) + tokens * beta * lo], dtype=torch.float64), 0)
        got = bench_diversity.log_partition(beta, tokens, p, right, 8)
        assert got == pytest.approx(direct.item() / tokens, rel=1e-6, abs=1e-9), (beta, tokens, p, right)
    assert bench_diversity.log_partition(0.0, 26, 0.5, 4, 8) == pytest.approx(0.0, abs=1e-12)


def test_diversity_bench_refuses_pieces_kept_from_other_settings(tmp_path, monkeypatch):
    """A piece under --out is reused only with the settings it was made with (recorded in its
    JSON): one made with another --n or key=value, or one that recorded none, is refused in one
    line before any work starts, and nothing goes into RESULTS.md."""
    import bench_diversity

    def no_work(*a, **k):
        raise AssertionError("the sweep started work")

    sweep = bench_diversity.Sweep(str(tmp_path), 4, ["trainer.steps=2"], 0)
    name, settings = sweep.run_piece("narrow", "flowrl:5", 0)
    made = {"last": {"mean@4": 0.5}, "wall_s": 3}
    assert sweep.cached(name, settings, lambda: made) == made
    assert sweep.cached(name, settings, no_work) == made  # the same settings: kept
    piece = tmp_path / "results" / f"{name}.json"
    assert json.loads(piece.read_text())["settings"] == json.loads(json.dumps(settings))
    for other in (bench_diversity.Sweep(str(tmp_path), 8, ["trainer.steps=2"], 0),
                  bench_diversity.Sweep(str(tmp_path), 4, ["trainer.steps=3"], 0)):
        with pytest.raises(bench_diversity.StalePiece, match=rf"{name}.json was made with other settings"):
            other.cached(*other.run_piece("narrow", "flowrl:5", 0), no_work)
    piece.write_text(json.dumps(made))  # kept by a version that recorded no settings
    with pytest.raises(bench_diversity.StalePiece, match=r"made with other settings \(None\)"):
        sweep.kept(name, settings)
    for damaged, says in (('{"last": {', "cannot be read"), ("[1, 2]", "is not a piece of this script")):
        piece.write_text(damaged)
        with pytest.raises(bench_diversity.StalePiece, match=rf"{name}.json {says}"):
            sweep.kept(name, settings)
    piece.write_text(json.dumps(made))

    monkeypatch.setattr(bench_diversity, "sh", no_work)
    results = tmp_path / "RESULTS.md"
    monkeypatch.setattr(sys, "argv", ["bench_diversity.py", "--seeds", "0", "--warm", "narrow", "--algos", "flowrl:5",
                                      "--n", "8", "--out", str(tmp_path), "--write", str(results), "trainer.steps=2"])
    with pytest.raises(SystemExit) as e:
        bench_diversity.main()
    assert "made with other settings" in str(e.value.code) and "\n" not in str(e.value.code)
    assert not results.exists()


# --- bench_rollout.py's parts (its runs need the vLLM venv and minutes: it is run by hand) -------

def _rollout_runs():
    import bench_rollout

    rows = [{"step": 0, "val/accuracy": 0.5}]
    for step, (t, length, sync, diff) in enumerate([(1.0, 10.0, 0.01, 1e-3), (2.0, 20.0, 0.05, 4e-3),
                                                     (3.0, 30.0, 0.02, 2e-3)], 1):
        rows.append({"step": step, "time/step_s": t, "time/rollout_s": t / 2, "response_length/mean": length,
                     "time/sync_s": sync, "time/update_s": t / 4, "memory/peak_gb": step / 2,
                     "rollout/logprob_diff_mean": diff})
    rows[-1]["val/accuracy"] = 0.75
    fig = bench_rollout.summarise(rows, samples_per_step=4, wall_s=12.0)
    extra = {"prompts_per_step": 2, "n": 2, "tree_peak_gb": 1.0, "tree_rss_sum_gb": 2.0}
    return fig, {"hf": [{**fig, **extra}], "vllm": [{**fig, **extra, "loop_steps_per_s": 1.0}]}


def test_rollout_bench_figures_come_from_the_run_metrics():
    import bench_rollout

    fig, _ = _rollout_runs()
    assert fig["steps"] == 3 and fig["loop_s"] == 6.0
    assert fig["loop_steps_per_s"] == pytest.approx(0.5) and fig["process_steps_per_s"] == pytest.approx(0.25)
    # response tokens (10 + 20 + 30) x 4 samples per step over the 3 s of rollout
    assert fig["rollout_tokens_per_s"] == pytest.approx(240 / 3.0)
    assert fig["sync_ms"] == pytest.approx(20.0) and fig["update_s"] == pytest.approx(0.5)
    assert fig["worker_peak_gb"] == 1.5 and (fig["val_first"], fig["val_last"]) == (0.5, 0.75)
    assert fig["logprob_diff"] == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="no steps"):
        bench_rollout.summarise([{"step": 0, "val/accuracy": 0.5}], 4, 1.0)


def test_rollout_bench_writes_a_numbered_section_once_and_keeps_its_number(tmp_path, capsys):
    import bench_rollout

    _, runs = _rollout_runs()
    path = tmp_path / "RESULTS.md"
    path.write_text("# R\n\n1. [A](#1-a)\n2. [B](#2-b)\n\n## 1. A\n\nx\n\n## 2. B\n\ny\n")
    info = {"cpu": "CPU", "gpu": None, "torch": "2.x", "vllm": "0.y"}
    body = bench_rollout.report(runs, info, ["trainer.steps=3"], 1, "load", str(path))
    assert body.startswith("## 3. Rollout engines: hf against vLLM\n") and "no GPU" in body
    assert "| hf | 0.500 | 0.500 | 0.250 | 12 | 80 | 20.0 | 0.500 | 1.50 | 1.00 | 2.00e-03 | 0.500 -> 0.750 |" in body
    assert "made 2.00x hf's steps per second" in body  # vllm's 1.0 against hf's 0.5
    text = path.read_text()
    toc = "2. [B](#2-b)\n3. [Rollout engines: hf against vLLM](#3-rollout-engines-hf-against-vllm)\n"
    assert toc in text and text.index(toc) < text.index("## 1. A")
    path.write_text(text + "\n## 4. Later\n")  # a section added after it: a rewrite keeps number 3
    bench_rollout.report(runs, info, [], 1, "load", str(path))
    text = path.read_text()
    assert text.count("<!-- rollout-backends:begin -->\n## 3. ") == 1 and text.count("3. [Rollout") == 1
    assert "## 4. Later" in text and "x\n\n## 2. B\n\ny\n" in text


def test_rollout_bench_tree_memory_counts_a_grandchild(tmp_path):
    import bench_rollout

    if not os.path.exists("/proc/self/smaps_rollup"):
        pytest.skip("no /proc/self/smaps_rollup")
    grandchild = "import time; b = b'x' * (200 << 20); open(r'%s', 'w').close(); time.sleep(30)" % (tmp_path / "up")
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"
    p = subprocess.Popen([sys.executable, "-c", parent])
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "up").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        with bench_rollout.TreePeak(p.pid, every=0.1) as tree:
            time.sleep(0.5)
    finally:
        for pid in [*bench_rollout.descendants(p.pid), p.pid]:
            os.kill(pid, 9)
        p.wait(timeout=30)
    assert tree.most_procs == 2 and 190 << 10 < tree.pss_kb and tree.pss_kb <= tree.rss_kb


def test_rollout_bench_rejects_settings_it_makes_itself():
    for args, msg in [(["rollout.backend=vllm"], "sets rollout.backend itself"),
                      (["--nope"], "--nope: not an option"),
                      (["--python", "/nonexistent/python"], "not an executable file"),
                      ([], "--python: the interpreter of a venv with vLLM")]:
        r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_rollout.py"), *args], cwd=ROOT,
                           env=_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)


def test_linear_bench_counts_the_flops_each_provider_executes():
    import bench_linear_token_logprob as bench

    cases = {c.case: c for c in bench.cases("cuda", quick=False)}
    s = {"N": 16384, "H": 4096, "V": 131072}
    nhv = 16384 * 4096 * 131072
    full = cases["forward + backward"]
    assert full.flops(s) == 6 * nhv  # the least work, the same for every provider
    assert full.work["ours"](s) == full.work["cce"](s) == full.work["liger_logprob"](s) == 8 * nhv  # recompute
    assert full.work["eager"](s) == full.work["liger_flce"](s) == 6 * nhv
    assert full.notes["cce"] == "exact"
    ignored = cases["fwd + bwd, 40 % rows ignored"]
    valid = 16384 - int(bench.ignored_rows(16384).sum())
    assert valid == 9828  # 6556 of 16384 rows (40.0 %) ignored, in runs of 4
    assert ignored.flops(s) == 6 * valid * 4096 * 131072
    assert ignored.work["ours"](s) == ignored.work["cce"](s) == 8 * valid * 4096 * 131072  # they skip them
    assert ignored.work["liger_flce"](s) == 6 * nhv and ignored.work["liger_logprob"](s) == 8 * nhv
    rows = [{"provider": p, "size": s, "ms": 100.0} for p in ("ours", "liger_flce", "eager")]
    harness.add_rates(rows, ignored, {"matmul_tflops": 800.0})
    by = {r["provider"]: r for r in rows}
    assert by["ours"]["tflops"] == by["liger_flce"]["tflops"] == pytest.approx(6 * valid * 4096 * 131072 / 0.1 / 1e12)
    assert by["ours"]["exec_tflops"] == pytest.approx(8 * valid * 4096 * 131072 / 0.1 / 1e12)
    assert by["liger_flce"]["exec_tflops"] == pytest.approx(6 * nhv / 0.1 / 1e12)
    assert "exec TFLOP/s" in harness.markdown_table([dict(r, op="o", case="c", dtype="bf16", status="ok") for r in rows])


def test_gpu_check_builds_with_the_system_pair_when_the_environment_links_its_own_runtime(tmp_path):
    import gpu_check

    if not (os.path.exists("/usr/bin/g++") and os.path.exists("/usr/bin/gcc")):
        pytest.skip("no system gcc/g++ pair")
    # as on the GPU machines the check first ran on: CXX a wrapper whose links carry a private libstdc++
    wrapper = tmp_path / "g++"
    wrapper.write_text('#!/bin/sh\nexec /usr/bin/g++ "$@" -static-libstdc++ -static-libgcc\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, CXX=str(wrapper), CC="/usr/bin/gcc")
    pair, why = gpu_check.choose_pair(env)
    assert pair == {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++"}, why
    assert str(wrapper) in why and "__cxa_throw" in why
    pair, why = gpu_check.choose_pair(dict(os.environ, CXX="/usr/bin/g++", CC="/usr/bin/gcc"))
    assert pair is None and "the environment's" in why


# --- the other scripts' smoke runs ---------------------------------------------------------------

def _script(name: str, *args: str, timeout: float = 300, env: dict | None = None) -> str:
    """The output of `benchmarks/<name> args...` run from the repository root; it must exit 0."""
    p = subprocess.run([sys.executable, os.path.join(BENCH, name), *args], cwd=ROOT, env=env or _env(),
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{name} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def test_every_benchmark_script_has_a_smoke_run():
    scripts = sorted(f for f in os.listdir(BENCH) if f.endswith(".py"))
    assert scripts == sorted(SMOKE), f"add the new script to SMOKE with its smoke run: {set(scripts) ^ set(SMOKE)}"
    named = {v.split(" (")[0] for v in SMOKE.values() if v.startswith("test_")}
    assert named and all(callable(globals().get(t)) for t in named), sorted(t for t in named if t not in globals())


def test_benchmarks_import_nothing_from_the_tests():
    # the test suite is not part of the product: a benchmark that leans on it breaks when the tests move
    for name in sorted(os.listdir(BENCH)):
        if name.endswith(".py"):
            with open(os.path.join(BENCH, name)) as f:
                text = f.read()
            # an import, or a module path handed to a child (data.reward_fn=tests.helpers...)
            assert not re.search(r"\b(import|from) tests\b|(?<![\w.])tests\.\w", text), name


def test_sandbox_bench_smoke():
    line = json.loads(_script("bench_sandbox.py", "--smoke").splitlines()[-1])
    assert line["tree"] == ROOT and (line["canonical_scored_1"], line["wrong_scored_1"]) == ("4/4", "0/4"), line


def test_genrm_server_bench_smoke_writes_its_section_and_figure(tmp_path):
    results = tmp_path / "RESULTS.md"
    _script("bench_genrm_server.py", "--smoke", "--write", str(results))
    md = results.read_text()
    assert md.count("<!-- genrm-server:begin -->") == 1 and "| 1 | 40 |" in md and "| 8 | 40 |" in md, md
    assert (tmp_path / "genrm_server.png").read_bytes()[:4] == b"\x89PNG"


def test_checkpoint_bench_smoke():
    out = _script("bench_checkpoint.py", "--smoke")
    assert "| default run (tiny Qwen2 + Z-head + AdamW) | " in out and "| synthetic, 2 shards | 10." in out, out


def test_transport_bench_smoke():
    out = _script("bench_transport.py", "--world", "2", "--mib", "2", "--repeats", "2")
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| 2 | ")]
    assert [r[1] for r in rows] == ["all_gather", "broadcast rows"], out
    assert all(float(r[2]) > 0 and float(r[3].rstrip(" |")) >= 0 for r in rows), out


def test_sequence_parallel_bench_smoke_checks_the_gradients(tmp_path):
    """Two gloo ranks, rows whole against rows cut: both rows of the table, half the tokens per
    forward at SP=2, each rank's peak, and the gradients of the two settings compared (the script
    exits non-zero past 1e-4)."""
    results = tmp_path / "RESULTS.md"
    out = _script("bench_sequence_parallel.py", "--smoke", "--write", str(results))
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| SP=")]
    assert [(r[0][2:6], r[1]) for r in rows] == [("SP=1", "128"), ("SP=2", "64")], out
    assert all(float(r[2].split()[0]) > 0 for r in rows), out
    rel = float(out.split("max relative difference ")[1].split(".\n")[0].rstrip("."))
    assert rel < 1e-4 and results.read_text().count("<!-- sequence-parallel-cpu:begin -->") == 1


def test_rewards_bench_smoke_writes_its_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    out = _script("bench_rewards.py", "--smoke", "--write", str(results))
    assert "| math: 20 responses (" in out and "| HumanEval: 4 canonical solutions in the sandbox |" in out, out
    assert "| scored by the pool (2 workers) |" in out
    assert results.read_text().count("<!-- rewards-cpu:begin -->") == 1


# Training on tiny settings: the run itself is what the smoke checks, so these are e2e.

def _tiny(tmp_path) -> list[str]:
    return [*TINY, f"sft.cache_dir={sft_cache(tmp_path)}"]


@pytest.mark.e2e
def test_gpu_smoke_runs_a_trainer_step_on_cpu():
    out = _script("gpu_smoke.py", "--device", "cpu", "--steps", "1", timeout=600)
    assert "gpu_smoke: step 1 in" in out and out.rstrip().endswith("gpu_smoke: ok"), out[-2000:]


@pytest.mark.e2e
def test_gpu_step_runs_a_timed_step_on_cpu(tmp_path):
    out = _script("gpu_step.py", "--device", "cpu", "--steps", "2", "--json", str(tmp_path / "gs.json"), timeout=600)
    res = json.loads(out.rstrip().splitlines()[-1])  # the last line: what gpu_check reads
    assert res == json.loads((tmp_path / "gs.json").read_text()) and res["finite"], res
    assert res["device"] == "cpu" and res["warmup_excluded"] and res["timed_steps"] == 1, res
    assert res["layout"]["sharding"] == "fsdp" and res["layout"]["fused"] and res["extra_forwards"] == 1, res
    # every response runs to its length: each step trains the same tokens
    assert res["tokens_per_step"] == 2 * 2 * res["seq_len"] and res["seq_len"] == 32, res
    assert res["rollout_tokens_per_s"] > 0 and res["update_tokens_per_s"] > 0 and res["step_s"] > 0, res
    assert res["mfu_update"] is None and res["peak"].startswith("unknown peak"), res


def test_gpu_step_counts_the_model_flops_and_names_the_peak():
    import gpu_step

    # two sequences of 3 and 5 tokens, one extra forward (the reference): (6 + 2) x params x tokens
    fl = gpu_step.step_flops(params=10, layers=2, attn_width=4, seq_lens=[3, 5], extra_forwards=1)
    assert fl == {"dense": 8 * 10 * 8, "attention": 8 * 2 * 4 * (9 + 25)}
    assert gpu_step.step_flops(10, 2, 4, [3, 5], 0)["dense"] == 6 * 10 * 8
    assert gpu_step.card_peak("NVIDIA H100 80GB HBM3")[0] == 989e12
    assert gpu_step.card_peak("NVIDIA H200")[0] == 989e12
    for name in ("NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", None):
        peak, how = gpu_step.card_peak(name)
        assert peak is None and how.startswith("unknown peak"), name
    assert gpu_step.comparable(512).startswith("not comparable") and "16384" in gpu_step.comparable(512)


@pytest.mark.e2e
def test_plan_truth_smoke_sets_a_cpu_run_beside_the_planner(tmp_path):
    out = _script("plan_truth.py", "--device", "cpu", "--smoke", "--json", str(tmp_path / "pt.json"), "--md",
                  str(tmp_path / "pt.md"), timeout=600)
    assert out.rstrip().splitlines()[-1].startswith("plan_truth: rollout measured "), out[-2000:]
    res = json.loads((tmp_path / "pt.json").read_text())
    assert res["device"] == "cpu" and res["finite"] and res["full_length_responses"], res
    assert res["layout_matches_planner"] and res["layout"]["sharding"] == "fsdp" and res["layout"]["fused"], res
    assert [sorted(s) for s in res["steps"]] == [["generate", "step", "sync", "update"]] * 2
    rows = {r["term"]: r for r in res["rows"]}
    # what the worker holds, storage by storage, is what the planner counts for it
    for term in ("policy parameters", "AdamW states (2)", "reference model", "hf rollout copy"):
        assert rows[term]["ratio"] == pytest.approx(1.0, abs=0.02), rows[term]
    for phase in ("rollout", "update"):
        p = res["phases"][phase]
        assert p["planned_gib"] > 0 and p["measured_gib"] > 0 and isinstance(p["pass"], bool), p
        assert p["ratio"] == pytest.approx(p["measured_gib"] / p["planned_gib"])
    assert "| **update phase, total** |" in (tmp_path / "pt.md").read_text()


@pytest.mark.e2e
def test_gpu_check_runs_plan_truth_on_cpu_when_asked_and_shows_its_table(tmp_path):
    _script("gpu_check.py", "--no-build", "--skip-tests", "--no-smoke", "--benchmarks", "", "--plan-truth-cpu",
            "--out", str(tmp_path), timeout=600)
    steps = {s["name"]: s for s in json.loads((tmp_path / "gpu_check.json").read_text())["steps"]}
    step = steps["plan-truth"]
    assert step["status"] == "ok" and step["results"]["device"] == "cpu", step
    assert step["summary"].startswith("plan_truth: rollout measured ") and ("PASS" in step["summary"]
                                                                          or "FAIL" in step["summary"]), step
    md = (tmp_path / "gpu_check.md").read_text()
    assert "## The memory planner against this run (plan-truth)" in md and "| **rollout phase, total** |" in md


@pytest.mark.e2e
def test_profile_trainer_smoke_profiles_a_worker_and_the_driver():
    out = _script("profile_trainer.py", "worker", "--smoke", timeout=600)
    assert "rank 0 over steps 3..3, per step: generate" in out, out[-3000:]
    split = {line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.rstrip().endswith(" s")}
    assert {"backward", "micro_batch", "optimizer.step", "clip_grad_norm", "sync_weights"} <= split, out[-3000:]
    assert "aten::mm" in out  # torch.profiler's operator table
    out = _script("profile_trainer.py", "driver", "--smoke", timeout=600)
    assert "reasonrl_fast/trainer/loop.py" in out and "function calls" in out, out[-3000:]


@pytest.mark.e2e
def test_algos_bench_on_tiny_settings_writes_its_section_and_figure(tmp_path):
    results = tmp_path / "RESULTS.md"
    out = _script("bench_algos.py", "--algos", "fapo", "--write", str(results), *_tiny(tmp_path), "trainer.steps=2",
                  timeout=900)
    row = json.loads(out.splitlines()[0])
    assert row["algo"] == "fapo" and row["steps"] == 2 and row["failures"] == 0, row
    md = results.read_text()
    assert md.count("<!-- embedded-algos:begin -->") == 1 and "| fapo | " in md
    assert (tmp_path / "embedded_algos.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.e2e
def test_async_bench_on_tiny_settings_writes_its_section(tmp_path):
    """One seed, one algorithm, the reward-latency case: the synchronous baseline (one worker of
    two threads) and split placement at staleness 1 (its trainer worker of two threads), each run
    for real, and the table with both rows."""
    results = tmp_path / "RESULTS.md"
    out = _script("bench_async.py", "--seeds", "0", "--algos", "grpo", "--latency", "0.01", "--staleness", "1",
                  "--sync-workers", "1x2", "--trainer-threads", "2", "--write", str(results), *_tiny(tmp_path),
                  "trainer.steps=3", "trainer.val_every=0", timeout=600)
    rows = [json.loads(x) for x in out.splitlines() if x.startswith('{"latency"')]
    assert [r["layout"] for r in rows] == ["sync, 1 worker(s) x 2 threads",
                                           "split, staleness 1, trainer 2 threads"], out
    assert all(r["steps"] == 3 for r in rows), rows
    sync, split = rows
    # the latency reward waited: 0.01 s a sample over the pool's 2 workers, 4 prompts x 2 samples a step
    assert sync["reward_s"] >= 0.01 * 8 / 2, sync
    # step 1 trains on samples of version 0 however far ahead it was submitted; steps 2-3 on version 1 ones
    assert 0 < split["staleness"] <= 1 and 0 <= split["trainer_busy"] <= 1 and 0 <= split["rollout_busy"] <= 1, split
    assert 0 <= split["partial"] <= 1, split
    md = results.read_text()
    assert md.count("<!-- async-split:begin -->") == 1, md
    assert "| 0.01 | - | grpo | sync, 1 worker(s) x 2 threads (baseline) | " in md, md
    assert "| 0.01 | - | grpo | split, staleness 1, trainer 2 threads | " in md, md


@pytest.mark.e2e
def test_async_bench_runs_fapo_against_a_late_genrm(tmp_path):
    """FAPO's case: the GenRM server the benchmark starts answers 0.2 s late, and every response
    counts as right, so that each step sends the GenRM requests (the tiny model cannot add yet):
    the synchronous step waits for the verdicts, and the split run ends."""
    results = tmp_path / "RESULTS.md"
    out = _script("bench_async.py", "--seeds", "0", "--algos", "fapo", "--latency", "0", "--genrm-latency", "0.2",
                  "--staleness", "1", "--sync-workers", "1", "--write", str(results), *_tiny(tmp_path),
                  "data.reward_fn=tests.helpers.faulty_rewards:always_right", "trainer.steps=3", "trainer.val_every=0",
                  timeout=600)
    rows = [json.loads(x) for x in out.splitlines() if x.startswith('{"latency"')]
    assert [r["layout"] for r in rows] == ["sync, 1 worker(s)", "split, staleness 1"], out
    assert all(r["steps"] == 3 for r in rows), rows
    assert rows[0]["genrm_wait_s"] >= 0.2, rows[0]  # a step's verdicts come no sooner than the latency
    md = results.read_text()
    assert "| 0 | 0.2 | fapo | sync, 1 worker(s) (baseline) | " in md and "| 0 | 0.2 | fapo | split, staleness 1 | " in md, md


@pytest.mark.e2e
def test_diversity_bench_on_tiny_settings_writes_its_section_and_figure(tmp_path):
    results, out = tmp_path / "RESULTS.md", tmp_path / "pieces"
    args = ["--seeds", "0", "--warm", "narrow", "--algos", "flowrl:5", "--n", "4", "--out", str(out),
            "--write", str(results), *_tiny(tmp_path), "rollout.max_new_tokens=26", "trainer.steps=2"]  # the task's least
    printed = _script("bench_diversity.py", *args, timeout=900)
    pieces = sorted(json.loads(x)["piece"] for x in printed.splitlines() if x.startswith('{"piece"'))
    assert pieces == ["first-narrow-0", "narrow-flowrl5-0"], printed
    md = results.read_text()
    assert md.count("<!-- partition-diversity:begin -->") == 1, md
    assert "| mean@4 | pass@4 | distinct@4 | entropy@4 | tv@4 | kl@4 |" in md, md
    for row in ("| narrow | warm start | ", "| narrow | flowrl β=5 | "):
        assert row in md, md
    run = json.loads((out / "results" / "narrow-flowrl5-0.json").read_text())
    floor = json.loads((out / "results" / "first-narrow-0.json").read_text())["floor"]
    # the tiny warm start seldom answers right: the distances are there, measured where it does
    assert {"tv@4", "kl@4", "tv_se@4"} <= run["last"].keys() & floor.keys(), (run, floor)
    assert not any(d.startswith("checkpoint-") for d in os.listdir(out / "runs" / "narrow-flowrl5-0"))
    assert "| narrow | flowrl β=5 | " in md.split("log-partition its residual needs")[1], md
    assert (tmp_path / "partition_diversity.png").read_bytes()[:4] == b"\x89PNG"
    # a second call with the same --out reuses every piece: nothing trains again
    again = _script("bench_diversity.py", *args, timeout=120)
    assert '{"piece"' not in again and "| narrow | flowrl β=5 | " in again
    # a trace: every checkpoint evaluated, in a section and figure of its own (the warm start reused)
    printed = _script("bench_diversity.py", *args, "--trace", "1", timeout=600)
    assert [json.loads(x)["piece"] for x in printed.splitlines() if x.startswith('{"piece"')] == ["narrow-flowrl5-0-trace1"]
    trace = json.loads((out / "results" / "narrow-flowrl5-0-trace1.json").read_text())["trace"]
    assert [t["step"] for t in trace] == [1, 2] and all("tv@4" in t for t in trace), trace
    md = results.read_text()
    assert md.count("<!-- partition-diversity-trace:begin -->") == 1 and "| narrow | flowrl β=5 | 2 | " in md, md
    sweep = md.split("<!-- partition-diversity:begin -->")[1].split("<!-- partition-diversity:end -->")[0]
    assert "| narrow | flowrl β=5 | " in sweep  # the sweep's section stays
    assert (tmp_path / "partition_diversity_trace.png").read_bytes()[:4] == b"\x89PNG"


# Another project's venv: built once and cached (the fixtures), one script at a time.

@pytest.mark.xproj
def test_rollout_bench_on_tiny_settings_runs_hf_and_vllm(tmp_path, vllm_python):
    results = tmp_path / "RESULTS.md"
    # vLLM's CPU attention refuses TINY's head dimension of 16: 64 / 2 heads
    _script("bench_rollout.py", "--python", str(vllm_python), "--repeats", "1", "--write", str(results),
            *_tiny(tmp_path), "model.hidden_size=64", "trainer.steps=2", timeout=1800)
    md = results.read_text()
    assert md.count("<!-- rollout-backends:begin -->") == 1 and "| hf | " in md and "| vllm | " in md, md


@pytest.mark.xproj
def test_vs_trl_bench_smoke_runs_both_trainers(trl_python):
    out = _script("bench_vs_trl.py", "--trl-python", str(trl_python), "--smoke", timeout=1800)
    assert "round 1 1x2: ours " in out and "| ours 1x2 (workers x threads) vs TRL" in out, out[-2000:]


@pytest.mark.xproj
def test_vllm_tp_bench_smoke_runs_every_layout(tmp_path, vllm_python):
    results = tmp_path / "RESULTS.md"
    _script("bench_vllm_tp.py", "--python", str(vllm_python), "--smoke", "--write", str(results), timeout=1800)
    md = results.read_text()
    assert md.count("<!-- vllm-tp-cpu:begin -->") == 1, md
    for row in ("| TP=1, 1 thread | 1 x 1 |", "| TP=2, 2 processes x 1 thread | 2 x 1 |", "| TP=1, 2 threads | 1 x 2 |"):
        assert row in md, md
