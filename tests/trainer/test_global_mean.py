"""The loss is normalised over the whole mini-batch across workers: two gloo ranks holding very
unequal token counts give, summed, the gradient of one process over everything (fp64)."""

import os
import signal
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.proc


@pytest.mark.parametrize("mode", ["replicate", "fsdp"])
def test_unequal_ranks_give_the_single_process_gradient(mode, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               SEED=str(torch.initial_seed() % 2**31), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                          os.path.join(ROOT, "tests", "helpers", "global_mean_child.py"), mode],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=180)
    finally:  # the ranks too, whether it ended or hung
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert p.returncode == 0, out[-2000:] + err[-3000:]
    assert f"OK 5 losses over 2 unequal ranks ({mode})" in out
