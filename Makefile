# The two commands a newcomer needs on a fresh CPU machine (Python 3.11): `make train`, `make test`.
# Every target installs what is missing first (in seconds when nothing changed) and can be run
# again at any time.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# The CPU build of torch. Never let pip resolve an unpinned torch: it would fetch a CUDA build.
TORCH_PIN ?= torch==2.13.0
# Triton for the CPU torch, whose wheel carries none: the Triton kernels' tests run in its
# interpreter. A CUDA torch brings its own triton, which is kept.
TRITON_PIN ?= triton==3.7.1

# The test tiers (tests/conftest.py): `make test` runs unit and proc on both cores and builds no
# venv; `make test-all` (CI) runs those the same way, then heavy (GPU-target and inductor compiles,
# several scripts at once), e2e (training, Ray) and xproj (TRL, verl and vLLM in cached venvs under
# ~/.cache/reasonrl_fast, built on first use) two at a time: one of those alone leaves a core idle
# much of the time (imports, Ray and engine start-up, waits on a child; RESULTS.md §12), so two side
# by side finish sooner. `make test-slow` runs the full learning checks. PYTEST_ARGS="-x -k name"
# passes options through. pytest-xdist hands out whole files (--dist loadfile; the heavy tiers
# --dist loadgroup: files, and one group of the tests that share a vLLM engine's checks or the
# trained run, tests/conftest.py): a module's fixtures run once, and tests that set process-wide
# state (TRITON_INTERPRET, torch's thread count) share one process.
PYTEST := $(PYTHON) -m pytest tests $(PYTEST_ARGS)
TEST_WORKERS ?= 2
FAST := -m "not (heavy or e2e or xproj or slow)" -n $(TEST_WORKERS) --dist loadfile

.PHONY: install test test-all test-slow train bench gpu-check gpu-wheels clean

# The project's own install rebuilds the C++ extension (about 100 s), so it runs only when needed:
# a stamp, build/.install-stamp-<interpreter>, is written after it succeeds, and it is trusted
# while none of the build's inputs (INSTALL_INPUTS) is newer than it and this interpreter imports
# this checkout's reasonrl_fast._C. The stamp's name keys on the interpreter: its resolved path,
# version and prefix and when its venv was made, so a new venv (even at a deleted one's path)
# installs again. One stamp at a time: the extension is built in place, shared by every venv.
INSTALL_INPUTS := setup.py pyproject.toml reasonrl_fast/toolchain.py csrc
PYTHON_KEY = $(shell $(PYTHON) -c 'import hashlib, os, shutil, sys; \
	given = os.path.abspath(shutil.which(sys.argv[1]) or sys.argv[1]); \
	cfg = os.path.join(sys.prefix, "pyvenv.cfg"); \
	made = os.stat(cfg).st_mtime_ns if os.path.exists(cfg) else 0; \
	ident = [given, os.path.realpath(given), sys.executable, sys.version, sys.prefix, made]; \
	print(hashlib.sha256(repr(ident).encode()).hexdigest()[:16])' "$(PYTHON)")
INSTALL_STAMP = build/.install-stamp-$(PYTHON_KEY)
# Run from / so that the checkout itself is not on sys.path: the import must come from the install.
INSTALLED_HERE = cd / && $(PYTHON) -c 'import os, sys, torch, reasonrl_fast._C as c; \
	sys.exit(not os.path.realpath(c.__file__).startswith(os.path.realpath(sys.argv[1]) + os.sep))' "$(CURDIR)"

install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH_PIN)"
	@$(PYTHON) -c "import triton" 2>/dev/null || $(PIP) install "$(TRITON_PIN)"
	@stamp="$(INSTALL_STAMP)"; \
	if [ -f "$$stamp" ] && [ -z "$$(find $(INSTALL_INPUTS) -newer "$$stamp")" ] \
			&& ($(INSTALLED_HERE)) 2>/dev/null; then \
		echo "reasonrl_fast is installed and up to date for $(PYTHON) (make clean to rebuild)"; \
	else \
		mkdir -p build && rm -f build/.install-stamp-* && touch "$$stamp.new" \
		&& echo '$(PIP) install --no-build-isolation -e ".[dev,train]"' \
		&& $(PIP) install --no-build-isolation -e ".[dev,train]" \
		&& mv "$$stamp.new" "$$stamp"; \
	fi

test: install
	$(PYTEST) $(FAST) --durations=15

# The CPU ops' loops are built per CPU capability and run at the widest the CPU has
# (csrc/capability.h); test-all runs the op tests again under each narrower one it has, forced
# by REASONRL_CPU_CAPABILITY (about 45 s each on 2 cores).
NARROWER_CAPS = cd / && $(PYTHON) -c 'import reasonrl_fast.ops as o; print(" ".join(o.cpu_capabilities()[:-1]))'

# Each part runs even when one before it fails; any failing fails the target.
test-all: install
	rc=0; \
	$(PYTEST) $(FAST) --durations=15 || rc=1; \
	for cap in $$($(NARROWER_CAPS)); do \
		echo "=== tests/ops at REASONRL_CPU_CAPABILITY=$$cap ==="; \
		REASONRL_CPU_CAPABILITY=$$cap $(PYTHON) -m pytest tests/ops $(PYTEST_ARGS) $(FAST) || rc=1; \
	done; \
	$(PYTEST) -m "heavy or e2e or xproj" -n $(TEST_WORKERS) --dist loadgroup --durations=60 || rc=1; \
	exit $$rc

test-slow: install
	$(PYTEST) -m slow --durations=0

# The main job: the embedded default run (a tiny model learns 2-digit addition with FlowRL on
# Ray + FSDP2, CPU; minutes on 2 cores, RESULTS.md §3). Extra settings: make train ARGS="algo=grpo".
train: install
	$(PYTHON) -m reasonrl_fast.train $(ARGS)

# The CPU ops benchmark; it rewrites its table in benchmarks/RESULTS.md.
bench: install
	$(PYTHON) benchmarks/bench_ops.py --write benchmarks/RESULTS.md

# On a machine with one GPU, a CUDA build of torch and nvcc, no network: build the CUDA kernels in
# place for the card present, check which _C.so loads, raise every op's errors (errpath), run the
# op tests, two trainer steps on the GPU, the whole RL step's throughput (benchmarks/gpu_step.py), the
# memory planner against a run, then the GPU benchmarks; within one budget (480 s), each
# step limited, every failure named in one results folder (benchmarks/gpu_results/). Build with the
# compiler pair whose libstdc++ torch loads (CC=/usr/bin/gcc CXX=/usr/bin/g++ where the environment
# names another). WHEELS=dir installs the wheels there first (liger-kernel, cut-cross-entropy, ...);
# GPU_CHECK_ARGS="--quick" for one size per benchmark. See docs/benchmarks.md.
gpu-check:
	$(PYTHON) -u benchmarks/gpu_check.py $(if $(WHEELS),--wheels $(WHEELS)) $(GPU_CHECK_ARGS)

# The peers' wheels for a GPU machine without network, fetched here beforehand (5 MB, for its
# Python GPU_PYTHON, x86-64): Liger-Kernel and Cut Cross-Entropy beside the kernels, omegaconf and
# pyyaml for the trainer's settings, py-spy for the stacks of a hang. Then, there:
# make gpu-check WHEELS=build/gpu-wheels GPU_CHECK_ARGS="--quick".
GPU_PYTHON ?= 3.12
GPU_WHEELS ?= liger-kernel==0.8.5 cut-cross-entropy==25.1.1 omegaconf==2.4.0 antlr4-python3-runtime==4.13.2 \
	pyyaml==6.0.4 py-spy==0.4.3
gpu-wheels:
	$(PIP) download --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) \
		--platform manylinux2014_x86_64 --platform any -d build/gpu-wheels $(GPU_WHEELS)

clean:
	rm -rf build *.egg-info reasonrl_fast/*.so
