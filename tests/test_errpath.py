"""The error-path check (reasonrl_fast/errpath.py): it passes on the installed extension, names a
crash by its signal and a hang by its stacks, and names the cause when the extension carries its
own C++ runtime (a build linked with -static-libstdc++, made here on purpose)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

from reasonrl_fast import errpath
from tests.helpers.childproc import ROOT

pytestmark = pytest.mark.proc  # every check runs in a child interpreter


def test_the_installed_extension_passes_every_case():
    (res,) = errpath.check(["cpu"], timeout=120)
    assert res["status"] == "ok", errpath.summary(res)
    assert res["passed"] == len(errpath._cases(__import__("torch"), "cpu")) + 1  # and the threads
    assert res["failures"] == [] and res["library"].endswith(".so")


def test_cuda_without_a_gpu_is_skipped_by_name():
    (res,) = errpath.check(["cuda"], timeout=120, repeat=0)
    assert res["status"] == "skipped" and res["reason"] == "no CUDA"


def _tiny_library(tmp_path, body: str) -> str:
    """A shared library whose constructor runs `body` when it is loaded."""
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    src = tmp_path / "lib.cpp"
    src.write_text("#include <csignal>\n#include <unistd.h>\n"
                   f"__attribute__((constructor)) static void on_load() {{ {body} }}\n")
    so = tmp_path / "lib.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(so), str(src)], check=True, timeout=120)
    return str(so)


def test_a_crash_is_named_by_its_signal_and_the_step_in_flight(tmp_path):
    so = _tiny_library(tmp_path, "std::raise(SIGSEGV);")
    (res,) = errpath.check(["cpu"], timeout=60, library=so)
    assert res["status"] == "crashed" and res["signal"] == "SIGSEGV", res
    assert res["in_flight"] == "loading the library"
    assert "Segmentation fault" in res["stderr"]  # faulthandler's report, with the Python stack
    text = errpath.summary(res)
    assert "crashed with SIGSEGV" in text and "in flight: loading the library" in text


def test_a_hang_is_killed_and_named_with_its_stacks(tmp_path):
    so = _tiny_library(tmp_path, "for (;;) pause();")
    # 10 s: the child imports torch (seconds on a loaded machine) before it loads the library
    (res,) = errpath.check(["cpu"], timeout=10, library=so)
    assert res["status"] == "hung" and res["seconds"] < 45, res
    assert res["in_flight"] == "loading the library"
    assert "errpath.py" in res["stderr"]  # faulthandler's dump of the Python stack, before the kill
    assert res["native_stacks"] and "thread" in res["native_stacks"].lower()
    assert "hung (killed after" in errpath.summary(res)


def test_cli_exit_status_and_json(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "reasonrl_fast.errpath", "--device", "all", "--repeat", "20",
                        "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cpu: ok" in r.stdout
    import json

    assert [x["device"] for x in json.loads(out.read_text())] == ["cpu", "cuda"]
    bad = subprocess.run([sys.executable, "-m", "reasonrl_fast.errpath", "--library", str(tmp_path / "none.so")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "no such file" in bad.stderr


@pytest.mark.e2e  # builds the extension's CPU half (about 40 s on 2 cores)
def test_a_build_with_its_own_cxx_runtime_fails_and_names_the_cause(tmp_path):
    # DEBUG=1 (-O0): the symptom is the link's, not the optimiser's, and it builds in 30 % less time
    env = dict(os.environ, REASONRL_FORCE_CPU="1", REASONRL_ALLOW_PRIVATE_RUNTIME="1", DEBUG="1",
               LDFLAGS="-static-libstdc++ -static-libgcc", MAX_JOBS=str(os.cpu_count() or 1))
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
                        "--build-temp", str(tmp_path / "tmp")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (so,) = glob.glob(str(tmp_path / "lib" / "reasonrl_fast" / "_C*.so"))
    (res,) = errpath.check(["cpu"], timeout=120, library=so)
    assert res["status"] in ("failed", "crashed", "hung"), errpath.summary(res)
    # the known symptom: messages cut at their first number
    assert any("not the expected one" in f for f in res["failures"]) or res["status"] != "failed"
    assert res["cause"] and "-static-libstdc++" in res["cause"], res.get("elf")
    assert "cause:" in errpath.summary(res)
