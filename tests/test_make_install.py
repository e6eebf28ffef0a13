"""`make install` runs pip only when something it builds from changed: the Makefile's stamp, run
in a scratch tree with the real Makefile, a stand-in interpreter that records pip's calls instead
of running them, and stand-ins for torch and the extension. Nothing here installs or builds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from pathlib import Path

import pytest

from tests.helpers.childproc import ROOT as _ROOT

ROOT = Path(_ROOT)

pytestmark = pytest.mark.proc  # runs make

# Answers pip's calls by appending them to pip.log; everything else runs the real interpreter,
# with the scratch tree's stand-in torch and reasonrl_fast first on its path.
_FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "$@" >> "{tree}/pip.log"; exit 0; fi
PYTHONPATH="{tree}/site" exec "{python}" "$@"
"""


def _tree(tmp_path):
    tree = tmp_path / "checkout"
    tree.mkdir()
    shutil.copy(ROOT / "Makefile", tree / "Makefile")
    for name in ("setup.py", "pyproject.toml", "reasonrl_fast/toolchain.py", "csrc/ops.cpp",
                 "csrc/kernels/ops.cu"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("")
    site = tree / "site"
    (site / "reasonrl_fast").mkdir(parents=True)
    (site / "torch.py").write_text("")
    (site / "triton.py").write_text("")
    (site / "reasonrl_fast" / "__init__.py").write_text("")
    (site / "reasonrl_fast" / "_C.py").write_text("")
    return tree


def _python(tree, name="python"):
    path = tree.parent / name
    path.write_text(_FAKE_PYTHON.format(tree=tree, python=sys.executable))
    path.chmod(0o755)
    return path


def _pip_runs(tree, python):
    """How many pip calls one `make install` made."""
    log = tree / "pip.log"
    log.unlink(missing_ok=True)
    out = subprocess.run(["make", "--no-print-directory", "-C", str(tree), "install",
                          f"PYTHON={python}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return log.read_text().splitlines() if log.exists() else []


def _change(tree, path):
    """Touch `path` after backdating the stamps, so that it is clearly newer than they are
    whatever the file system's time resolution."""
    earlier = time.time() - 10
    for stamp in (tree / "build").glob(".install-stamp-*"):
        os.utime(stamp, (earlier, earlier))
    os.utime(path)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_install_runs_pip_only_when_an_input_or_the_interpreter_changed(tmp_path):
    tree = _tree(tmp_path)
    python = _python(tree)
    install = ["-m pip install --no-build-isolation -e .[dev,train]"]

    assert _pip_runs(tree, python) == install  # a fresh clone installs
    assert _pip_runs(tree, python) == []  # nothing changed: no pip at all
    assert len(list((tree / "build").glob(".install-stamp-*"))) == 1

    _change(tree, tree / "csrc" / "kernels" / "ops.cu")
    assert _pip_runs(tree, python) == install
    assert _pip_runs(tree, python) == []

    _change(tree, tree / "csrc")  # a new source file: its folder changed
    (tree / "csrc" / "new_op.cpp").write_text("")
    assert _pip_runs(tree, python) == install

    _change(tree, tree / "pyproject.toml")
    assert _pip_runs(tree, python) == install
    assert _pip_runs(tree, python) == []

    # Another interpreter (a new venv) installs again, and its stamp replaces the first one's:
    # the extension is built in place, so only the last install's interpreter is up to date.
    other = _python(tree, "other-python")
    assert _pip_runs(tree, other) == install
    assert _pip_runs(tree, other) == []
    assert _pip_runs(tree, python) == install

    # A stamp is not trusted when the interpreter cannot import the extension.
    (tree / "site" / "reasonrl_fast" / "_C.py").unlink()
    assert _pip_runs(tree, python) == install
    assert _pip_runs(tree, python) == install
