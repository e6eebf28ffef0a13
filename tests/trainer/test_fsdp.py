"""trainer/fsdp.py: the weight sync's one all-gather per dtype equals one full_tensor per
parameter, on real FSDP2 shards over gloo (a few seconds per world size)."""

import os
import signal
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.proc  # FSDP2 ranks under torchrun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("world", [2, 4])
def test_gather_full_equals_full_tensor(world, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               SEED=str(torch.initial_seed() % 2**31), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    # its own session, so that a hang ends with every rank killed, not only torchrun
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
                          "--standalone", os.path.join(ROOT, "tests", "helpers", "fsdp_gather_child.py")],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=120)
    finally:  # the ranks too, whether it ended or hung
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert p.returncode == 0, out[-2000:] + err[-3000:]
    assert f"OK 6 parameters on {world} ranks" in out
