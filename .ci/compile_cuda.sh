#!/usr/bin/env bash
# Compile-only check of the CUDA kernels (csrc/kernels/*.cu) so they cannot rot on machines
# without a GPU. Exit status != 0 when the build fails or a cubin for sm_80 / sm_90 is missing.
#
# Environment (all optional):
#   VENV_CUDA        venv holding a CUDA build of torch (default ~/.cache/reasonrl_fast/venv-cuda); created with
#                    `pip install torch==$TORCH_CUDA_VERSION ninja setuptools wheel` if absent,
#                    reused otherwise (the system python and its CPU torch are never touched).
#   TORCH_CUDA_VERSION  default 2.14.1 (a CUDA 13.0 build on this project's package index)
#   CUDA_HOME        default /usr/local/cuda (nvcc 13.0); must be set, or the link step looks
#                    for libcudart in the wrong place.
#   TORCH_CUDA_ARCH_LIST  default "8.0;9.0"
#   MAX_JOBS         default 1 (the CI machine has 2 shared cores)
#   KEEP_BUILD=1     keep the scratch build directory (printed at the end)
#   COMPILE_CUDA_FORCE=1  build even when these exact inputs passed before (see below)
#
# A pass is remembered under the venv's folder, keyed on everything the build reads: setup.py,
# pyproject.toml, csrc/, reasonrl_fast/toolchain.py, this script, torch's and nvcc's versions and
# the arch list. With the same key the build would be the same, so CI skips it and says so (the
# build takes one of the two cores for 6-10 minutes beside the tests); a change to any input
# builds again. Failures are never remembered.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_CUDA="${VENV_CUDA:-${XDG_CACHE_HOME:-$HOME/.cache}/reasonrl_fast/venv-cuda}"
TORCH_CUDA_VERSION="${TORCH_CUDA_VERSION:-2.14.1}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}"
export MAX_JOBS="${MAX_JOBS:-1}"
export FORCE_CUDA=1
unset REASONRL_FORCE_CPU || true
t0=$(date +%s)

if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
  echo "compile_cuda: no nvcc at $CUDA_HOME/bin/nvcc" >&2
  exit 2
fi

py="$VENV_CUDA/bin/python"
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then
  echo "compile_cuda: creating $VENV_CUDA with torch==$TORCH_CUDA_VERSION (CUDA build)"
  python3 -m venv "$VENV_CUDA"
  nice "$VENV_CUDA/bin/pip" install --quiet "torch==$TORCH_CUDA_VERSION" ninja setuptools wheel
fi
"$py" -c "import torch; print('compile_cuda: torch', torch.__version__, 'CUDA', torch.version.cuda)"
"$CUDA_HOME/bin/nvcc" --version | tail -n 2
t1=$(date +%s)

key="$( { (cd "$repo" && find setup.py pyproject.toml csrc reasonrl_fast/toolchain.py .ci/compile_cuda.sh -type f \
            ! -name '*.so' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum);
          "$py" -c "import torch; print(torch.__version__, torch.version.cuda)";
          "$CUDA_HOME/bin/nvcc" --version; echo "$TORCH_CUDA_ARCH_LIST"; } | sha256sum | cut -c1-16 )"
passed="$VENV_CUDA.passed/$key"
if [ -f "$passed" ] && [ "${COMPILE_CUDA_FORCE:-0}" != "1" ]; then
  echo "compile_cuda: OK, unchanged: these exact inputs (key $key) passed on $(cat "$passed");" \
       "not built again (COMPILE_CUDA_FORCE=1 builds)"
  exit 0
fi

# Scratch copy: the worktree's in-place CPU build (reasonrl_fast/_C*.so, build/) is untouched.
scratch="$(mktemp -d /tmp/rrl-cuda-build.XXXXXX)"
cleanup() { if [ "${KEEP_BUILD:-0}" != "1" ]; then rm -rf "$scratch"; fi; }
trap cleanup EXIT
tar -C "$repo" --exclude='*.so' --exclude='build' --exclude='__pycache__' -cf - \
  setup.py pyproject.toml csrc reasonrl_fast | tar -C "$scratch" -xf -

(cd "$scratch" && nice "$py" setup.py build_ext --build-temp "$scratch/build/tmp" \
  --build-lib "$scratch/build/lib") > "$scratch/build.log" 2>&1 || {
  tail -n 80 "$scratch/build.log" >&2
  echo "compile_cuda: FAILED to compile the CUDA kernels" >&2
  exit 1
}
t2=$(date +%s)
grep -E "warning" "$scratch/build.log" | grep -E "csrc/kernels" | head -n 20 || true

so="$(find "$scratch/build/lib" -name '_C*.so' | head -n 1)"
[ -n "$so" ] || { echo "compile_cuda: no _C*.so produced" >&2; exit 1; }

# cuobjdump ships with triton's wheel (triton/backends/nvidia/bin) and with the CUDA toolkit.
cuobjdump="$("$py" -c 'import os, triton; print(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump"))' 2>/dev/null || true)"
[ -x "$cuobjdump" ] || cuobjdump="$CUDA_HOME/bin/cuobjdump"
[ -x "$cuobjdump" ] || cuobjdump="$(command -v cuobjdump || true)"
[ -n "$cuobjdump" ] || { echo "compile_cuda: no cuobjdump found" >&2; exit 1; }
elfs="$("$cuobjdump" --list-elf "$so")"
echo "$elfs"
status=0
ncu=$(ls "$repo"/csrc/kernels/*.cu | wc -l)
for arch in sm_80 sm_90; do
  n=$(grep -c "\.$arch\.cubin" <<< "$elfs" || true)
  if [ "$n" -lt "$ncu" ]; then
    echo "compile_cuda: $n $arch cubins for $ncu .cu files" >&2
    status=1
  fi
done
syms="$("$cuobjdump" --dump-elf-symbols "$so" 2>/dev/null || true)"
for k in forward_kernel backward_kernel group_adv_kernel tb_seq_kernel tb_mean_kernel \
         tb_backward_kernel masked_mean_kernel masked_mean_backward_kernel; do
  # grep -q on a here-string: with pipefail, `echo | grep -q` can fail on SIGPIPE.
  grep -q "$k" <<< "$syms" || { echo "compile_cuda: no symbol for $k" >&2; status=1; }
done
# The built library loads without a GPU and registers a CUDA kernel for every op schema.
(cd "$scratch" && "$py" - "$so" <<'PY' 2>&1 | grep -v -i numpy) || status=1
# Load the built file itself: a reasonrl_fast package on sys.path (the worktree's CPU build)
# must not shadow it.
import importlib.util
import sys

import torch

spec = importlib.util.spec_from_file_location("_C", sys.argv[1])  # PyInit__C
spec.loader.exec_module(importlib.util.module_from_spec(spec))
ops = ["token_logprob", "token_logprob_backward", "token_logprob_backward_", "group_advantage",
       "tb_loss", "tb_loss_backward", "masked_mean", "masked_mean_backward"]
missing = [o for o in ops
           if not torch._C._dispatch_has_kernel_for_dispatch_key(f"reasonrl_fast::{o}", "CUDA")]
print("compile_cuda: CUDA kernels registered for", len(ops) - len(missing), "of", len(ops), "ops",
      "(missing: " + ", ".join(missing) + ")" if missing else "")
sys.exit(1 if missing else 0)
PY
nsym=$(grep -c "STO_ENTRY" <<< "$syms" || true)
echo "compile_cuda: $nsym kernel entry points; venv $((t1 - t0)) s, build $((t2 - t1)) s, total $(( $(date +%s) - t0 )) s"
if [ "$status" = 0 ]; then
  echo "compile_cuda: OK (sm_80 and sm_90 cubins for every kernel unit)"
  mkdir -p "$(dirname "$passed")" && date -u +%Y-%m-%dT%H:%MZ > "$passed"
fi
if [ "${KEEP_BUILD:-0}" = "1" ]; then echo "compile_cuda: build kept in $scratch"; fi
exit "$status"
