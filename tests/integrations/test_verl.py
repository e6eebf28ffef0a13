"""reasonrl_fast inside verl 0.9.1, in verl's own process model: a fresh process of a venv that
holds verl (and torch 2.13.0 CPU, the torch the compiled ops were built against) imports verl,
and verl's own entry-point loading must register our estimator and policy loss (and, with
REASONRL_FAST_VERL_PATCH=1, patch its functions); the numbers must equal verl's own functions'
(verl_ops_driver.py does the comparisons there and reports each check).

The entry point reaches verl as an installed distribution would give it: a dist-info folder
whose entry_points.txt holds the `verl.plugins` entry of setup.py, on PYTHONPATH beside the
work tree (installing the package itself would recompile the extension).

The venv is verl's one (tests/helpers/venvs.py), built once and cached; without the package
registry the test is skipped with the reason. With the venv in place the file took 37 s on the
2-core development machine (importing verl is 9-19 s of each of the two processes, depending on
the machine's load).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.venvs import child_env

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "helpers" / "verl_ops_driver.py"


def _verl_plugin_entries() -> list[str]:
    """setup.py's `verl.plugins` entries, read from its source (running it would build)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            return list(ast.literal_eval(node.value)["verl.plugins"])
    raise AssertionError("setup.py declares no entry_points")


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    info = site / "reasonrl_fast-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: reasonrl_fast\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[verl.plugins]\n" + "\n".join(_verl_plugin_entries()) + "\n")
    return site


def _run(python: Path, site: Path, mode: str) -> dict:
    env = child_env(PYTHONPATH=f"{ROOT}{os.pathsep}{site}")
    if mode == "patched":
        env["REASONRL_FAST_VERL_PATCH"] = "1"
    proc = subprocess.run([str(python), str(DRIVER), mode], capture_output=True, text=True,
                          timeout=300, env=env, cwd=str(site))
    _, marker, answer = proc.stdout.rpartition("\n@@result@@\n")
    assert proc.returncode == 0 and marker, (
        f"the driver failed in verl's venv (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(answer)


def _assert_checks(result: dict, must_have: list[str]) -> None:
    names = [c["name"] for c in result["checks"]]
    for name in must_have:
        assert name in names, f"check {name!r} did not run"
    failed = [f"{c['name']}: {c['detail']}" for c in result["checks"] if not c["ok"]]
    assert not failed, "\n".join(failed)


def test_entry_point_is_setup_pys():
    assert _verl_plugin_entries() == ["reasonrl_fast = reasonrl_fast.integrations.verl_plugin:register"]


def test_plugin_registers_and_matches_verl(verl_python, plugin_site):
    result = _run(verl_python, plugin_site, "plain")
    _assert_checks(result, ["plugin module imported by verl's entry-point loading",
                            "advantage estimator registered", "policy loss registered",
                            "grpo advantages norm_by_std=True", "grpo advantages norm_by_std=False",
                            "verl compute_advantage(adv_estimator=reasonrl_fast_grpo) norm_by_std=False",
                            "flowrl without log_z refuses", "flowrl loss = mean_b w delta^2",
                            "no patch without the env var", "undo restores the originals exactly",
                            "linear_cross_entropy grads tau=0.6"])
    print(f"verl plain: {result['seconds']}")


def test_env_var_patches_at_verl_import(verl_python, plugin_site):
    result = _run(verl_python, plugin_site, "patched")
    _assert_checks(result, ["verl_F.logprobs_from_logits is ours", "verl_F.entropy_from_logits is ours",
                            "transformer_impl.logprobs_from_logits is ours", "linear_cross_entropy is ours",
                            "undo restores verl's functions", "logprobs_from_logits grad tau=0.7 inplace=True",
                            "FusedLinearForPPO (patched) tau=0.6"])
    print(f"verl patched: {result['seconds']}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-s"]))
