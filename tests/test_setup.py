"""setup.py's choice of CPU or CUDA kernels, run without building (`setup.py --name`), and its
toolchain checks: one compiler pair of GCC >= 12, and a built library that shares torch's C++
runtime (reasonrl_fast/toolchain.py). Nothing here builds the extension itself."""

from __future__ import annotations

import glob
import json
import os
import runpy
import shutil
import subprocess
import sys

import pytest
import setuptools

from reasonrl_fast import toolchain
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


# The toolchain checks (reasonrl_fast/toolchain.py, setup.py's BuildExt). Fake compilers are
# shell scripts that answer --version and -dumpfullversion like GCC (or clang) and fail on
# anything else, so a test that reached a compile step would say so.

_FAKE = """#!/bin/sh
case "$1" in
  --version) {banner};;
  -dumpfullversion|-dumpversion) echo {dump};;
  *) echo "fake compiler asked to compile: $*" >&2; exit 1;;
esac
"""


def _fake(directory, name, version="12.2.0", clang=False):
    """A fake compiler `directory/name` reporting `version`; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    if clang:  # clang answers -dumpversion with a GCC-compatibility version, not its own
        banner = f'echo "clang version {version}"; echo "Target: x86_64-pc-linux-gnu"'
        dump = "4.2.1"
    else:
        banner = (f'echo "{name} (GCC) {version}"; '
                  f'echo "Copyright (C) 2023 Free Software Foundation, Inc."')
        dump = version
    path = directory / name
    path.write_text(_FAKE.format(banner=banner, dump=dump))
    path.chmod(0o755)
    return str(path)


def test_compiler_pair_takes_the_c_driver_beside_cxx(tmp_path):
    bin_ = tmp_path / "bin"
    for name in ("c++", "cc", "g++-12", "gcc-12", "gcc", "mycxx"):
        _fake(bin_, name)
    opt = tmp_path / "opt" / "gcc" / "bin"
    opt_gxx, opt_gcc = _fake(opt, "g++", "13.3.0"), _fake(opt, "gcc", "13.3.0")
    path = {"PATH": str(bin_)}
    b = str(bin_)
    assert toolchain.compiler_pair(path) == (f"{b}/cc", f"{b}/c++")  # CXX unset: c++ and cc
    assert toolchain.compiler_pair({**path, "CXX": "g++-12"}) == (f"{b}/gcc-12", f"{b}/g++-12")
    # Beside CXX, not the first gcc on PATH (bin/gcc here): that may be another compiler.
    assert toolchain.compiler_pair({**path, "CXX": opt_gxx}) == (opt_gcc, opt_gxx)
    # A name without a C sibling: the gcc beside it.
    assert toolchain.compiler_pair({**path, "CXX": "mycxx"}) == (f"{b}/gcc", f"{b}/mycxx")
    # A link to another installation: its C driver is looked up beside the link's target too.
    link = tmp_path / "link"
    link.mkdir()
    os.symlink(opt_gxx, link / "g++")
    linked = str(link / "g++")
    assert toolchain.compiler_pair({**path, "CXX": linked}) == (opt_gcc, linked)
    # CC set: taken as it is, resolved on PATH.
    pair = toolchain.compiler_pair({**path, "CXX": "g++-12", "CC": "cc"})
    assert pair == (f"{b}/cc", f"{b}/g++-12")

    with pytest.raises(toolchain.ToolchainError, match="g\\+\\+-99"):
        toolchain.compiler_pair({**path, "CXX": "g++-99"})
    with pytest.raises(toolchain.ToolchainError, match="gcc-77"):
        toolchain.compiler_pair({**path, "CC": "gcc-77"})
    lonely = _fake(tmp_path / "lonely", "g++")  # no C driver beside it: CC must be set
    with pytest.raises(toolchain.ToolchainError, match="set CC"):
        toolchain.compiler_pair({**path, "CXX": lonely})


def test_check_gcc_refuses_gcc_11_and_names_the_fix(tmp_path):
    old = _fake(tmp_path, "g++-11", "11.4.0")
    assert toolchain.gcc_version(old) == (11, 4, 0)
    with pytest.raises(toolchain.ToolchainError) as e:
        toolchain.check_gcc(old)
    msg = str(e.value)
    for needle in (old, "11.4.0", "GCC >= 12", 'target("arch=x86-64-v4")', "csrc/capabilities.h",
                   "g++-12", "CC=gcc-12 CXX=g++-12", "pip install --no-build-isolation"):
        assert needle in msg, msg
    toolchain.check_gcc(_fake(tmp_path, "g++-12", "12.2.0"))
    toolchain.check_gcc(_fake(tmp_path, "g++-13", "13.3.0"))
    # clang is not GCC: its -dumpversion (4.2.1) is not read as a GCC 4, and it is not checked.
    clang = _fake(tmp_path, "clang++", "17.0.6", clang=True)
    assert toolchain.gcc_version(clang) is None
    toolchain.check_gcc(clang)
    with pytest.raises(toolchain.ToolchainError, match="could not be started"):
        toolchain.gcc_version(str(tmp_path / "missing-g++"))


def _build_ext(env: dict, tmp_path):
    """`setup.py build_ext` into tmp_path, expected to stop: (the process, its output, the
    build-temp folder, which must hold no object file when the build stopped before compiling)."""
    temp = tmp_path / "temp"
    p = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-temp", str(temp),
                        "--build-lib", str(tmp_path / "lib")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    return p, out, temp


def test_setup_refuses_gcc_11_before_compiling(tmp_path):
    fake = tmp_path / "fake"
    cxx = _fake(fake, "g++", "11.4.0")
    _fake(fake, "gcc", "11.4.0")
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}
    env.update(CXX=cxx, REASONRL_FORCE_CPU="1")
    p, out, temp = _build_ext(env, tmp_path)
    for needle in ("GCC >= 12", f"{cxx} is GCC 11.4.0", "csrc/capabilities.h", "g++-12"):
        assert needle in p.stderr, out[-3000:]
    # Stopped before any compile: the fake compiler was never asked, no object was written.
    assert "fake compiler asked to compile" not in out
    assert not temp.exists() or not list(temp.rglob("*.o"))


_THROWER = """#include <stdexcept>
extern "C" int tiny_throw(int x) {
  if (x < 0) throw std::runtime_error("negative");
  return x + 1;
}
"""


@pytest.fixture(scope="module")
def tiny_libs(tmp_path_factory):
    """Two shared libraries from one throwing function, built by the real g++: `shared` links
    the shared C++ runtime, `private` carries its own (-static-libstdc++ -static-libgcc)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ on PATH")
    d = tmp_path_factory.mktemp("tiny")
    (d / "t.cpp").write_text(_THROWER)
    libs = {}
    for name, flags in (("shared", []), ("private", ["-static-libstdc++", "-static-libgcc"])):
        out = d / f"{name}.so"
        p = subprocess.run([gxx, "-shared", "-fPIC", *flags, str(d / "t.cpp"), "-o", str(out)],
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0 and name == "private":
            pytest.skip(f"g++ cannot link libstdc++ statically here: {p.stderr[-500:]}")
        assert p.returncode == 0, p.stderr
        libs[name] = str(out)
    return libs


def test_elf_facts_tell_a_private_cxx_runtime(tiny_libs):
    shared = toolchain.elf_facts(tiny_libs["shared"])
    assert "libstdc++.so.6" in shared["needed"], shared
    assert shared["defines_cxa_throw"] is False, shared
    assert any(c.startswith("GCC:") for c in shared["comment"]), shared
    assert shared["glibcxx_required"].startswith("GLIBCXX_"), shared
    assert shared["notes"] == [], shared
    assert toolchain.private_runtime_problem(shared) is None

    private = toolchain.elf_facts(tiny_libs["private"])
    assert "libstdc++.so.6" not in private["needed"], private
    assert private["defines_cxa_throw"] is True, private
    msg = toolchain.private_runtime_problem(private)
    for needle in (tiny_libs["private"], "__cxa_throw", "-static-libstdc++",
                   "CC=gcc CXX=g++ pip install --no-build-isolation -e ."):
        assert needle in msg, msg


@pytest.fixture(scope="module")
def static_only_gxx(tmp_path_factory):
    """A g++ like some prebuilt toolchains in /opt: a wrapper that runs the real g++ with -B
    pointing at a directory holding libstdc++.a and no libstdc++.so. The driver turns -B into
    -L, so -lstdc++ finds the archive first and every library it links carries a private C++
    runtime, with no -static-libstdc++ on any command line."""
    gxx, gcc = shutil.which("g++"), shutil.which("gcc")
    if gxx is None or gcc is None:
        pytest.skip("no g++/gcc on PATH")
    archive = subprocess.run([gxx, "-print-file-name=libstdc++.a"], capture_output=True,
                             text=True, timeout=60).stdout.strip()
    if not os.path.isabs(archive):
        pytest.skip("g++ has no libstdc++.a")
    root = tmp_path_factory.mktemp("optgcc")
    (root / "lib").mkdir()
    os.symlink(archive, root / "lib" / "libstdc++.a")
    (root / "bin").mkdir()
    for name, real in (("g++", gxx), ("gcc", gcc)):
        (root / "bin" / name).write_text(f'#!/bin/sh\nexec {real} -B{root}/lib/ "$@"\n')
        (root / "bin" / name).chmod(0o755)
    return str(root / "bin" / "g++")


def test_probe_link_finds_a_compiler_that_links_libstdcxx_statically(static_only_gxx):
    assert toolchain.libstdcxx_for_link(static_only_gxx).endswith("/lib/libstdc++.a")
    facts = toolchain.probe_link(static_only_gxx)
    assert facts["defines_cxa_throw"] is True, facts
    msg = toolchain.private_runtime_problem(facts)
    assert msg and "libstdc++.a but no libstdc++.so" in msg and "CC=gcc CXX=g++" in msg, msg
    # The same compiler without the wrapper, and with the flag: the first is fine.
    gxx = shutil.which("g++")
    assert toolchain.libstdcxx_for_link(gxx).endswith("libstdc++.so")
    assert toolchain.private_runtime_problem(toolchain.probe_link(gxx)) is None
    flagged = toolchain.probe_link(gxx, ["-static-libstdc++", "-static-libgcc"])
    assert "-static-libstdc++" in toolchain.private_runtime_problem(flagged)
    failed = toolchain.probe_link(gxx, ["-lreasonrl_fast_no_such_lib"])
    assert failed["needed"] is None and "probe link" in failed["notes"][0]


def test_setup_refuses_a_compiler_that_links_libstdcxx_statically(static_only_gxx, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX", "LDFLAGS", "CXXFLAGS")}
    env.update(CXX=static_only_gxx, REASONRL_FORCE_CPU="1")
    env.pop("REASONRL_ALLOW_PRIVATE_RUNTIME", None)
    p, out, temp = _build_ext(env, tmp_path)
    for needle in ("refusing to build", "__cxa_throw", "libstdc++.a", "CC=gcc CXX=g++",
                   "REASONRL_ALLOW_PRIVATE_RUNTIME=1"):
        assert needle in p.stderr, out[-3000:]
    assert not temp.exists() or not list(temp.rglob("*.o"))  # refused before compiling


def test_elf_facts_without_binutils_say_so(tiny_libs, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no readelf, no nm
    facts = toolchain.elf_facts(tiny_libs["private"])
    assert facts["needed"] is None and facts["comment"] is None, facts
    assert facts["defines_cxa_throw"] is None, facts
    assert any("readelf" in n for n in facts["notes"]) and any("nm" in n for n in facts["notes"])
    assert toolchain.private_runtime_problem(facts) is None  # unknown is not a finding


def test_the_installed_extension_shares_torchs_cxx_runtime():
    """The _C.so the tests import, through the command line a GPU machine would run."""
    import reasonrl_fast

    so = sorted(glob.glob(os.path.join(os.path.dirname(reasonrl_fast.__file__), "_C*.so")))
    assert so, "reasonrl_fast/_C*.so not built (pip install --no-build-isolation -e .)"
    p = subprocess.run([sys.executable, "-m", "reasonrl_fast.toolchain", so[0]],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["private_runtime_problem"] is None, out
    assert "libstdc++.so.6" in out["elf"]["needed"] and out["elf"]["defines_cxa_throw"] is False
    tc = out["toolchain"]
    # The CLI imports torch first, so the process's libstdc++ is the one torch loaded.
    assert tc["loaded_libstdcxx"] and os.path.isfile(tc["loaded_libstdcxx"]), tc
    assert tc["cxx"] and tc["cc"], tc


def test_loaded_libstdcxx_is_the_file_torch_loaded():
    import torch  # noqa: F401  (its libraries load libstdc++)

    path = toolchain.loaded_libstdcxx()
    assert path and os.path.isfile(path) and os.path.basename(path).startswith("libstdc++.so"), path
    gxx = shutil.which("g++")
    if gxx:
        own = toolchain.compiler_libstdcxx(gxx)
        assert own is None or os.path.isfile(own)
    assert toolchain.soversion("/x/libstdc++.so.6.0.30") == (6, 0, 30)


_FAKE_NVCC = r"""#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "nvcc: NVIDIA (R) Cuda compiler driver"
  echo "Cuda compilation tools, release 12.4, V12.4.131"
  exit 0
fi
host=gcc
while [ $# -gt 0 ]; do [ "$1" = "-ccbin" ] && host="$2"; shift; done
echo "#\$ _NVVM_BRANCH_=nvvm"
echo "#\$ $host -D__CUDA_ARCH_LIST__=520 -E -x c++ -D__CUDACC__ probe.cu"
"""


def test_nvcc_host_compiler_is_cc_or_the_gcc_on_path(tmp_path):
    """nvcc compiles the .cu files' host code with -ccbin (torch passes $CC), else with the
    first gcc on PATH, which need not belong to CXX."""
    bin_ = tmp_path / "bin"
    gcc11 = _fake(bin_, "gcc", "11.4.0")
    gcc12 = _fake(bin_, "gcc-12", "12.2.0")
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text(_FAKE_NVCC)
    (cuda / "bin" / "nvcc").chmod(0o755)
    env = {"PATH": str(bin_)}
    info = toolchain.nvcc_info(str(cuda), {**env, "CC": gcc12})
    assert info["path"] == str(cuda / "bin" / "nvcc") and "release 12.4" in info["version"], info
    assert (info["host_compiler"], info["host_compiler_version"]) == (gcc12, "12.2.0"), info
    assert info["host_compiler_how"] == "-ccbin $CC", info
    info = toolchain.nvcc_info(str(cuda), env)
    assert (info["host_compiler"], info["host_compiler_version"]) == (gcc11, "11.4.0"), info
    assert "PATH" in info["host_compiler_how"], info
    assert toolchain.nvcc_info(str(tmp_path / "nocuda"), env)["path"] is None

    d = toolchain.describe({**env, "CXX": _fake(bin_, "g++-12", "12.2.0")}, cuda_home=str(cuda))
    assert (d["cc"], d["cc_version"], d["cxx_version"]) == (gcc12, "12.2.0", "12.2.0"), d
    json.dumps(d)  # the command line prints it


@pytest.fixture
def build_ext_class(monkeypatch):
    """setup.py's build_ext command class, from running setup.py with setup() captured."""
    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.setenv("REASONRL_FORCE_CPU", "1")  # no CUDA toolkit needed to read the class
    monkeypatch.chdir(ROOT)
    runpy.run_path(os.path.join(ROOT, "setup.py"), run_name="reasonrl_fast_setup")
    return captured["cmdclass"]["build_ext"]


def test_build_ext_refuses_a_library_with_its_own_cxx_runtime(build_ext_class, tiny_libs, tmp_path,
                                                              monkeypatch, capsys):
    monkeypatch.delenv("REASONRL_ALLOW_PRIVATE_RUNTIME", raising=False)
    build_ext_class.check_built(tiny_libs["shared"])  # the shared runtime: kept

    bad = tmp_path / "_C.so"
    shutil.copy(tiny_libs["private"], bad)
    with pytest.raises(SystemExit) as e:
        build_ext_class.check_built(str(bad))
    msg = str(e.value.code)
    for needle in ("refusing", "-static-libstdc++", "__cxa_throw",
                   "REASONRL_ALLOW_PRIVATE_RUNTIME=1"):
        assert needle in msg, msg
    assert not bad.exists()  # removed, so the next build links it again

    shutil.copy(tiny_libs["private"], bad)
    monkeypatch.setenv("REASONRL_ALLOW_PRIVATE_RUNTIME", "1")  # built so on purpose: kept, warned
    build_ext_class.check_built(str(bad))
    assert bad.exists()
    assert "REASONRL_ALLOW_PRIVATE_RUNTIME=1" in capsys.readouterr().out
