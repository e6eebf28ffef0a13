"""The compilers a build of reasonrl_fast._C uses, and what the built library links against.

`_C.so` throws C++ exceptions (the argument checks in csrc/checks.h) that libtorch catches and
turns into Python errors. That hand-over works only when `_C.so` and torch share one C++ runtime:
the libstdc++.so.6 (and libgcc_s.so.1) that the Python process has loaded. A `_C.so` linked with
-static-libstdc++/-static-libgcc carries a second, private runtime; its exceptions then come out
with cut messages, or crash or hang the process. A g++ can also link libstdc++ statically with no
such flag: a wrapper whose -B directory holds libstdc++.a but no libstdc++.so (-B becomes -L, so
-lstdc++ finds the archive first); probe_link and libstdcxx_for_link find that before a build.
A different g++ version alone is fine, as long as the library links the shared runtime. So the
rules are:

  - one compiler pair (CC, CXX) for the whole library: setup.py sets both, because nvcc compiles
    the host half of the .cu files with `-ccbin $CC` when CC is set and with the first `gcc` on
    PATH otherwise, which may be another compiler than the one building the .cpp files;
  - GCC >= 12 (csrc/capabilities.h compiles the kernels' loops with `target("arch=x86-64-v4")`);
  - the built library lists libstdc++.so.6 as NEEDED and does not define `__cxa_throw` itself.

This module only reads facts (it runs the compilers, nvcc, readelf and nm); setup.py and
reasonrl_fast.errpath decide what to do with them. It uses the standard library only, and no
other reasonrl_fast module: setup.py loads it by file path before the package is installed.

    python -m reasonrl_fast.toolchain             # the compilers, nvcc, the libstdc++ in use
    python -m reasonrl_fast.toolchain path/_C.so  # plus that library's ELF facts
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping

_TIMEOUT_S = 60

# The C driver beside each C++ driver; clang++ before g++, whose name it contains.
_SIBLINGS = (("clang++", "clang"), ("g++", "gcc"), ("c++", "cc"))

FIX = ("rebuild without -static-libstdc++/-static-libgcc (look for them in LDFLAGS, LDSHARED, "
       "CXX and CFLAGS), with the system g++ whose libstdc++ the Python process loads: "
       "CC=gcc CXX=g++ pip install --no-build-isolation -e .")


class ToolchainError(Exception):
    """No usable compiler, or one that cannot build reasonrl_fast; the message says what to do."""


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _run_env(env: Mapping[str, str] | None) -> dict | None:
    # A partial mapping ({"CC": ...}) overrides the process environment; it does not replace it
    # (a child without PATH finds neither its assembler nor its linker).
    return None if env is None else {**os.environ, **env}


def _which(name: str, env: Mapping[str, str] | None = None) -> str | None:
    found = shutil.which(name, path=_env(env).get("PATH"))
    return os.path.abspath(found) if found else None


def _run(cmd: list, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess | None:
    """The finished process, or None when it could not be started or did not finish in time."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S,
                              env=_run_env(env), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _sibling_name(cxx_name: str) -> str | None:
    for cpp, c in _SIBLINGS:
        i = cxx_name.rfind(cpp)
        if i >= 0:
            return cxx_name[:i] + c + cxx_name[i + len(cpp):]
    return None


def compiler_pair(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The absolute (CC, CXX) a build uses. CXX is $CXX or `c++`; CC is $CC, else the C driver
    beside CXX (g++-12 -> gcc-12, /opt/gcc/bin/g++ -> /opt/gcc/bin/gcc, c++ -> cc), else `gcc`
    beside it. It is looked up beside CXX, not on PATH: the first gcc on PATH may belong to
    another compiler than CXX, and nvcc compiles the .cu files' host code with CC."""
    e = _env(env)
    cxx_name = e.get("CXX") or "c++"
    cxx = _which(cxx_name, env)
    if cxx is None:
        raise ToolchainError(
            f"no C++ compiler found: CXX={cxx_name!r} is not an executable on PATH. Install g++ "
            f"12 or newer (Debian/Ubuntu: apt-get install g++) or set CXX to its path.")
    if e.get("CC"):
        cc = _which(e["CC"], env)
        if cc is None:
            raise ToolchainError(f"CC={e['CC']!r} is not an executable on PATH; set CC to the gcc "
                                 f"that belongs to CXX={cxx}.")
        return cc, cxx
    sibling = _sibling_name(os.path.basename(cxx_name))
    names = [n for n in (sibling, "gcc") if n]
    # Beside the path found on PATH first (/usr/bin/c++ -> /usr/bin/cc), then beside the file it
    # links to (/usr/local/bin/g++ -> /opt/gcc/bin/g++).
    dirs = list(dict.fromkeys([os.path.dirname(cxx), os.path.dirname(os.path.realpath(cxx))]))
    for name in names:
        for d in dirs:
            cand = os.path.join(d, name)
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand, cxx
    raise ToolchainError(
        f"no C compiler beside CXX={cxx} (looked for {', '.join(names)} in {', '.join(dirs)}); "
        f"set CC to the gcc of the same installation as CXX.")


def _is_gcc(version_text: str) -> bool:
    # GCC's --version names the FSF in its copyright line; clang and the vendor compilers that
    # mimic GCC's flags (icx, nvc++) do not.
    return "Free Software Foundation" in version_text and "clang" not in version_text.lower()


def gcc_version(compiler: str) -> tuple[int, ...] | None:
    """GCC's version, e.g. (12, 2, 0); None when `compiler` is not GCC (clang answers
    -dumpversion too, with a made-up version, so --version decides first). Raises ToolchainError
    when the compiler cannot be run."""
    p = _run([compiler, "--version"])
    if p is None or p.returncode != 0:
        why = ("could not be started" if p is None
               else f"exited with {p.returncode}: {p.stderr.strip()[:300]}")
        raise ToolchainError(f"`{compiler} --version` {why}")
    if not _is_gcc(p.stdout + p.stderr):
        return None
    p = _run([compiler, "-dumpfullversion", "-dumpversion"])
    m = re.match(r"\s*(\d+(?:\.\d+)*)", p.stdout) if p is not None and p.returncode == 0 else None
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _dotted(v: tuple[int, ...] | None) -> str | None:
    return ".".join(map(str, v)) if v is not None else None


def check_gcc(compiler: str, minimum: tuple[int, ...] = (12,)) -> None:
    """Raise ToolchainError when `compiler` is a GCC older than `minimum`. Only GCC is checked:
    other compilers pass (the build itself says whether they can compile the sources)."""
    v = gcc_version(compiler)
    if v is None or v >= tuple(minimum):
        return
    need = _dotted(tuple(minimum))
    raise ToolchainError(
        f"GCC >= {need} is required, but {compiler} is GCC {_dotted(v)}: "
        f"csrc/capabilities.h compiles the kernels' loops once per CPU capability, with "
        f'__attribute__((target("arch=x86-64-v3"))) and __attribute__((target("arch=x86-64-v4"))), '
        f"built and tested with GCC 12 and newer. Install g++-{need} or newer "
        f"(Debian/Ubuntu: apt-get install g++-{need}) and build with it and its gcc, e.g. "
        f"CC=gcc-{need} CXX=g++-{need} pip install --no-build-isolation -e . "
        f"(CC matters too: nvcc compiles the CUDA files' host code with it).")


def compiler_libstdcxx(cxx: str) -> str | None:
    """The libstdc++.so.6 that belongs to `cxx` (resolved), or None when it has none (GCC
    answers -print-file-name with the bare name when it does not find the file). Not
    necessarily what a link uses: see libstdcxx_for_link."""
    p = _run([cxx, "-print-file-name=libstdc++.so.6"])
    if p is None or p.returncode != 0:
        return None
    out = p.stdout.strip()
    return os.path.realpath(out) if os.path.isabs(out) and os.path.exists(out) else None


def loaded_libstdcxx() -> str | None:
    """The libstdc++.so.6 mapped into this process (resolved), or None (not loaded yet, or no
    /proc). Import torch first: its libraries are what load it."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and os.path.basename(parts[5]).startswith("libstdc++.so"):
            return os.path.realpath(parts[5].strip())
    return None


def libstdcxx_for_link(cxx: str) -> str | None:
    """The file `-lstdc++` resolves to when `cxx` links a shared library: the first
    libstdc++.so or libstdc++.a along its library search path (the linker takes the .so over
    the .a only within one directory). A libstdc++.a here means every library it links carries
    a private C++ runtime, with no -static-libstdc++ anywhere: e.g. a g++ wrapper whose -B
    directory holds libstdc++.a but no libstdc++.so."""
    p = _run([cxx, "-print-search-dirs"])
    if p is None or p.returncode != 0:
        return None
    m = re.search(r"^libraries: =?(.*)$", p.stdout, re.MULTILINE)
    for d in (m.group(1).split(os.pathsep) if m else []):
        for name in ("libstdc++.so", "libstdc++.a"):
            path = os.path.join(d, name)
            if d and os.path.exists(path):
                return os.path.normpath(path)
    return None


def soversion(path: str | None) -> tuple[int, ...] | None:
    """(6, 0, 30) for .../libstdc++.so.6.0.30; None when the name carries no version."""
    m = re.search(r"\.so\.(\d+(?:\.\d+)*)$", path or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _cuda_home_guess(env: Mapping[str, str] | None) -> str | None:
    # torch.utils.cpp_extension's order: $CUDA_HOME, $CUDA_PATH, nvcc on PATH, /usr/local/cuda.
    e = _env(env)
    home = e.get("CUDA_HOME") or e.get("CUDA_PATH")
    if home:
        return home
    nvcc = _which("nvcc", env)
    if nvcc:
        return os.path.dirname(os.path.dirname(nvcc))
    return "/usr/local/cuda" if os.path.exists("/usr/local/cuda") else None


def _dryrun_host_compiler(nvcc: str, ccbin: str | None, env) -> str | None:
    """The host compiler nvcc itself reports in a dry run (no file is read or written), which
    also honours NVCC_CCBIN, NVCC_PREPEND_FLAGS and nvcc.profile."""
    cmd = [nvcc, "--dryrun"] + (["-ccbin", ccbin] if ccbin else []) + [
        "-c", "reasonrl_fast_probe.cu", "-o", os.devnull]
    p = _run(cmd, env)
    if p is None:
        return None
    for line in (p.stdout + p.stderr).splitlines():
        if line.startswith("#$ ") and " -E -x c++" in line:
            try:
                return shlex.split(line[3:])[0]
            except (ValueError, IndexError):
                return None
    return None


def nvcc_info(cuda_home: str | None, env: Mapping[str, str] | None = None) -> dict:
    """nvcc and the host compiler it will use for the .cu files: {path, version, host_compiler,
    host_compiler_how, host_compiler_version, notes}. torch's build passes `-ccbin $CC` when CC
    is set; without it nvcc runs the first `gcc` on PATH (or $NVCC_CCBIN)."""
    e = _env(env)
    info: dict = {"path": None, "version": None, "host_compiler": None, "host_compiler_how": None,
                  "host_compiler_version": None, "notes": []}
    if e.get("PYTORCH_NVCC"):  # torch's ninja build runs this instead (e.g. "ccache .../nvcc")
        words = shlex.split(e["PYTORCH_NVCC"])
        nvcc = _which(words[-1], env) if words else None
        info["notes"].append(f"PYTORCH_NVCC={e['PYTORCH_NVCC']!r} replaces CUDA_HOME/bin/nvcc")
    else:
        home = cuda_home or _cuda_home_guess(env)
        cand = os.path.join(home, "bin", "nvcc") if home else None
        nvcc = cand if cand and os.path.isfile(cand) else None
        if nvcc is None:
            info["notes"].append(f"no nvcc (CUDA_HOME={home})")
    info["path"] = nvcc
    if nvcc:
        p = _run([nvcc, "--version"], env)
        lines = (p.stdout.splitlines() if p is not None else [])
        info["version"] = next((l.strip() for l in lines if "release" in l), None) or (
            lines[-1].strip() if lines else None)
    ccbin = e.get("CC") or None
    if ccbin:
        host, how = _which(ccbin, env) or ccbin, "-ccbin $CC"
    elif e.get("NVCC_CCBIN"):
        host, how = _which(e["NVCC_CCBIN"], env) or e["NVCC_CCBIN"], "$NVCC_CCBIN"
    else:
        host, how = _which("gcc", env), "first gcc on PATH (CC unset)"
    if nvcc:
        seen = _dryrun_host_compiler(nvcc, ccbin, env)
        if seen:
            seen_abs = seen if os.path.isabs(seen) else (_which(seen, env) or seen)
            if host is None or os.path.realpath(seen_abs) != os.path.realpath(host):
                info["notes"].append(f"nvcc --dryrun runs {seen}, not {host}")
                host, how = seen_abs, how + "; as nvcc --dryrun reports"
    info["host_compiler"], info["host_compiler_how"] = host, how
    if host:
        try:
            v = gcc_version(host)
            info["host_compiler_version"] = _dotted(v) if v else "not GCC"
        except ToolchainError as err:
            info["notes"].append(str(err))
    return info


def describe(env: Mapping[str, str] | None = None, cuda_home: str | None = None) -> dict:
    """Every toolchain fact in one JSON-ready dict: cc, cxx, their versions, the libstdc++ of the
    compiler, the one its links use and the one of this process, whether a probe library it
    links carries its own C++ runtime, and nvcc with its host compiler. Never raises: what
    could not be found is None, with the reason in notes."""
    d: dict = {"cc": None, "cxx": None, "cc_version": None, "cxx_version": None,
               "compiler_libstdcxx": None, "libstdcxx_for_link": None,
               "probe_links_own_runtime": None, "loaded_libstdcxx": loaded_libstdcxx(),
               "nvcc": None, "notes": []}
    try:
        d["cc"], d["cxx"] = compiler_pair(env)
    except ToolchainError as err:
        d["notes"].append(str(err))
    for key in ("cc", "cxx"):
        if d[key]:
            try:
                v = gcc_version(d[key])
                d[f"{key}_version"] = _dotted(v) if v else "not GCC"
            except ToolchainError as err:
                d["notes"].append(str(err))
    if d["cxx"]:
        d["compiler_libstdcxx"] = compiler_libstdcxx(d["cxx"])
        d["libstdcxx_for_link"] = libstdcxx_for_link(d["cxx"])
        probe = probe_link(d["cxx"])
        d["probe_links_own_runtime"] = (private_runtime_problem(probe) is not None
                                        if probe["needed"] is not None else None)
        d["notes"] += probe["notes"]
    d["nvcc"] = nvcc_info(cuda_home, env)
    return d


def _tool(name: str, args: list, notes: list) -> str | None:
    path = shutil.which(name)
    if path is None:
        notes.append(f"{name} not found (binutils): the facts it reads are unknown")
        return None
    p = _run([path] + args)
    if p is None or p.returncode != 0:
        why = p.stderr.strip()[:300] if p else "not run"
        notes.append(f"{name} {' '.join(args[:-1])} failed: {why}")
        return None
    return p.stdout


def elf_facts(so_path: str) -> dict:
    """What a shared library links and carries: {path, needed, runpath, rpath, comment,
    defines_cxa_throw, glibcxx_required, notes}. needed/runpath/rpath/glibcxx_required come from
    `readelf -d`/`-V`, comment (the compilers that built its parts) from `readelf -p .comment`,
    defines_cxa_throw (whether it carries its own C++ runtime) from `nm -D --defined-only`. A
    missing tool leaves its facts None and says so in notes."""
    notes: list = []
    facts: dict = {"path": os.path.realpath(so_path), "needed": None, "runpath": None,
                   "rpath": None, "comment": None, "defines_cxa_throw": None,
                   "glibcxx_required": None, "notes": notes}
    if not os.path.isfile(so_path):
        notes.append(f"{so_path} does not exist")
        return facts
    out = _tool("readelf", ["-d", "-W", so_path], notes)
    if out is not None:
        facts["needed"] = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
        m = re.search(r"\(RUNPATH\)\s+Library runpath: \[([^\]]*)\]", out)
        facts["runpath"] = m.group(1) if m else None
        m = re.search(r"\(RPATH\)\s+Library rpath: \[([^\]]*)\]", out)
        facts["rpath"] = m.group(1) if m else None
    out = _tool("readelf", ["-p", ".comment", "-W", so_path], notes)
    if out is not None:  # no .comment section: readelf warns on stderr and lists nothing
        rows = re.finditer(r"^\s*\[\s*[0-9a-f]+\]\s+(.*)$", out, re.MULTILINE)
        facts["comment"] = [m.group(1).strip() for m in rows]
    out = _tool("readelf", ["-V", "-W", so_path], notes)
    if out is not None:
        vers = {tuple(int(x) for x in v.split("."))
                for v in re.findall(r"Name: GLIBCXX_(\d+(?:\.\d+)*)", out)}
        facts["glibcxx_required"] = f"GLIBCXX_{_dotted(max(vers))}" if vers else None
    out = _tool("nm", ["-D", "--defined-only", so_path], notes)
    if out is not None:
        names = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()}
        facts["defines_cxa_throw"] = "__cxa_throw" in names
    return facts


_PROBE_SOURCE = """#include <stdexcept>
extern "C" int reasonrl_fast_probe(int x) {
  if (x < 0) throw std::runtime_error("negative");
  return x + 1;
}
"""


def probe_link(cxx: str, flags: list | tuple = (), env: Mapping[str, str] | None = None) -> dict:
    """Link a five-line throwing shared library with `cxx` and `flags` (e.g. $LDFLAGS) the way
    the extension is linked, and return its elf_facts: a second or so that tells, before a
    build of minutes, whether every library this compiler links carries its own C++ runtime.
    When the link fails, the facts are empty and notes say why."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="reasonrl_fast_probe_") as d:
        src, out = os.path.join(d, "probe.cpp"), os.path.join(d, "probe.so")
        with open(src, "w") as f:
            f.write(_PROBE_SOURCE)
        p = _run([cxx, "-shared", "-fPIC", *flags, src, "-o", out], env)
        if p is None or p.returncode != 0:
            why = "could not be started" if p is None else p.stderr.strip()[-500:]
            return {"path": None, "needed": None, "defines_cxa_throw": None,
                    "notes": [f"probe link with {cxx} failed: {why}"]}
        facts = elf_facts(out)
    facts["path"] = f"a library linked by {cxx}" + (f" {' '.join(flags)}" if flags else "")
    return facts


def private_runtime_problem(facts: dict) -> str | None:
    """Why the library in `facts` (elf_facts) cannot hand exceptions to torch, or None. It
    carries its own C++ runtime when it defines __cxa_throw or does not need libstdc++.so.6
    (a C++ extension always throws, so it needs one of the two); unknown facts raise nothing."""
    needed = facts.get("needed")
    found = []
    if facts.get("defines_cxa_throw"):
        found.append("defines __cxa_throw itself")
    if needed is not None and "libstdc++.so.6" not in needed:
        found.append("does not list libstdc++.so.6 as NEEDED "
                     f"(NEEDED: {', '.join(needed) or 'nothing'})")
    if not found:
        return None
    return (
        f"{facts.get('path')} carries its own C++ runtime: it {' and '.join(found)}, the mark of a "
        f"static libstdc++ (a link with -static-libstdc++/-static-libgcc, or by a g++ whose "
        f"library directory holds libstdc++.a but no libstdc++.so). Its exceptions (the argument "
        f"checks of "
        f"csrc/checks.h) are thrown by that private runtime and caught by libtorch's, the "
        f"libstdc++.so.6 the Python process loaded; across two runtimes messages come out cut "
        f"and the process may crash or hang. Fix: {FIX}")


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reasonrl_fast.toolchain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("library", nargs="?", help="a built _C.so whose ELF facts to add")
    a = p.parse_args(sys.argv[1:] if argv is None else [str(x) for x in argv])
    if a.library and not os.path.isfile(a.library):
        p.error(f"{a.library}: no such file")
    try:  # the libstdc++ that matters is the one torch's libraries load
        import torch  # noqa: F401
    except ImportError:
        pass
    out = {"toolchain": describe()}
    if a.library:
        facts = elf_facts(a.library)
        out["elf"] = facts
        out["private_runtime_problem"] = private_runtime_problem(facts)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
