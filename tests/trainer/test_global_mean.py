"""The loss is normalised over the whole mini-batch across workers: two gloo ranks holding very
unequal token counts give, summed, the gradient of one process over everything (fp64)."""

import pytest

from tests.helpers.procs import torchrun

pytestmark = pytest.mark.proc  # ranks under torchrun


@pytest.mark.parametrize("mode", ["replicate", "fsdp"])
def test_unequal_ranks_give_the_single_process_gradient(mode, tmp_path):
    rc, out, err = torchrun("global_mean_child.py", 2, [mode], tmp_path, timeout=180)
    assert rc == 0, out[-2000:] + err[-3000:]
    assert f"OK 5 losses over 2 unequal ranks ({mode})" in out
