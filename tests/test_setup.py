"""setup.py's choice of CPU or CUDA kernels, run without building (`setup.py --name`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.childproc import ROOT

pytestmark = pytest.mark.proc  # setup.py runs in a child interpreter

# One child interpreter runs setup.py once per case, with torch.version.cuda and CUDA_HOME
# faked, and prints "ok" or the message the build stopped with.
_CHILD = """
import os, runpy, sys
import torch
import torch.utils.cpp_extension as ce

cases = [
    ("12.4", None, {}),
    ("12.4", None, {"REASONRL_FORCE_CPU": "1"}),
    (None, None, {}),
    (None, None, {"FORCE_CUDA": "1"}),
]
for cuda, home, env in cases:
    torch.version.cuda, ce.CUDA_HOME = cuda, home
    for k in ("REASONRL_FORCE_CPU", "FORCE_CUDA"):
        os.environ.pop(k, None)
    os.environ.update(env)
    sys.argv = ["setup.py", "--name"]
    try:
        runpy.run_path("setup.py", run_name="__main__")
        print("RESULT ok", flush=True)
    except SystemExit as e:
        print("RESULT exit", str(e.code).replace("\\n", " "), flush=True)
"""


def test_cuda_torch_without_nvcc_stops_the_build():
    p = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    results = [line.split(" ", 2)[1:] for line in p.stdout.splitlines() if line.startswith("RESULT")]
    assert len(results) == 4, p.stdout
    (kind0, msg0), cpu_forced, cpu_torch, (kind3, msg3) = results
    # A CUDA torch without nvcc: the build stops and says what to install, and how to opt out.
    assert kind0 == "exit"
    for needle in ("nvcc", "CUDA_HOME", "12.4", "torch.version.cuda", "REASONRL_FORCE_CPU=1"):
        assert needle in msg0, msg0
    assert cpu_forced == ["ok"] and cpu_torch == ["ok"]  # an explicit CPU build; a CPU torch
    assert kind3 == "exit" and "nvcc" in msg3  # FORCE_CUDA=1 without nvcc
