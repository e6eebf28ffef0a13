"""trainer/fsdp.py: the weight sync's one all-gather per dtype equals one full_tensor per
parameter, on real FSDP2 shards over gloo (a few seconds per world size)."""

import pytest

from tests.helpers.procs import torchrun

pytestmark = pytest.mark.proc  # ranks under torchrun


@pytest.mark.parametrize("world", [2, 4])
def test_gather_full_equals_full_tensor(world, tmp_path):
    rc, out, err = torchrun("fsdp_gather_child.py", world, [], tmp_path, timeout=120)
    assert rc == 0, out[-2000:] + err[-3000:]
    assert f"OK 6 parameters on {world} ranks" in out
