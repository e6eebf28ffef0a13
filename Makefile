# The two commands a newcomer needs on a fresh CPU machine (Python 3.11): `make train`, `make test`.
# Both install what is missing first and can be run again at any time.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# The CPU build of torch. Never let pip resolve an unpinned torch: it would fetch a CUDA build.
TORCH_PIN ?= torch==2.13.0
# Triton for the CPU torch, whose wheel carries none: the Triton kernels' tests run in its
# interpreter. A CUDA torch brings its own triton, which is kept.
TRITON_PIN ?= triton==3.7.1

.PHONY: install test train bench clean

install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH_PIN)"
	@$(PYTHON) -c "import triton" 2>/dev/null || $(PIP) install "$(TRITON_PIN)"
	$(PIP) install --no-build-isolation -e ".[dev]"

test: install
	$(PYTHON) -m pytest tests

# The main job. Until the trainer lands it is the ops benchmark, which rewrites its table in
# benchmarks/RESULTS.md.
train: bench

bench: install
	$(PYTHON) benchmarks/bench_ops.py --write benchmarks/RESULTS.md

clean:
	rm -rf build *.egg-info reasonrl_fast/*.so
