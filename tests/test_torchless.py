"""The planner and a config error in a venv without torch (and without transformers or the compiled
extension): only the settings' own dependencies, omegaconf and pyyaml, installed, and this
checkout on PYTHONPATH. `python -m reasonrl_fast.plan` reads a recipe's model from the shipped
shapes; a typo'd key is one `error:` line with exit status 2."""

import subprocess

import pytest

from tests.helpers import venvs

pytestmark = pytest.mark.xproj  # a cached venv of its own

TORCHLESS_VENV = "venv-torchless"
TORCHLESS_INSTALLS = [["omegaconf==2.4.0", "pyyaml==6.0.4"]]


@pytest.fixture(scope="module")
def python():
    py = venvs.python_or_skip(TORCHLESS_VENV, TORCHLESS_INSTALLS, 600.0)
    probe = subprocess.run([str(py), "-c", "import torch"], capture_output=True, text=True, env=venvs.child_env())
    assert probe.returncode != 0, "the venv must not have torch"
    return str(py)


def _run(python, *args):
    return subprocess.run([python, "-m", *args], cwd=venvs.REPO, capture_output=True, text=True, timeout=300,
                          env=venvs.child_env())


def test_a_config_error_is_one_line(python):
    p = _run(python, "reasonrl_fast.train", "configs/default.yaml", "trainer.stepz=3")
    assert p.returncode == 2, p.stderr[-3000:]
    assert p.stderr.startswith("error: config key 'trainer.stepz'") and p.stderr.count("\n") == 1, p.stderr


def test_plan_runs(python):
    p = _run(python, "reasonrl_fast.plan", "configs/grpo_qwen2.5_32b_dapo.yaml")  # Qwen2.5-32B: a shipped shape
    assert p.returncode == 0, p.stderr[-3000:]
    assert "peak:" in p.stdout and "32.8 B params" in p.stdout
