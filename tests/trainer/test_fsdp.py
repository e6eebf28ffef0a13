"""trainer/fsdp.py: the weight sync's one all-gather per dtype equals one full_tensor per
parameter, on real FSDP2 shards over gloo (a few seconds per world size)."""

import pytest

from tests.helpers.procs import torchrun

pytestmark = pytest.mark.proc  # ranks under torchrun


@pytest.mark.parametrize("world", [2, 4])
def test_gather_full_equals_full_tensor(world, tmp_path):
    rc, out, err = torchrun("fsdp_gather_child.py", world, [], tmp_path, timeout=120)
    assert rc == 0, out[-2000:] + err[-3000:]
    assert f"OK 8 parameters on {world} ranks" in out


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_actor_with_a_zhead_shards_and_trains_in_its_master_dtype(dtype, tmp_path):
    """FlowRL's actor under FSDP2 as a GPU run shards it: the Z-head sits in the root group with
    the embeddings and the head, which FSDP2 refuses if their dtypes differ."""
    rc, out, err = torchrun("zhead_shard_child.py", 2, [dtype], tmp_path, timeout=120)
    assert rc == 0, out[-2000:] + err[-3000:]
    assert f"OK 33 parameters in {dtype} on 2 ranks" in out, out


def test_publishing_holds_one_bucket_beyond_the_shard(tmp_path, monkeypatch):
    """Trainer rank 0's peak while it publishes an FSDP2 model to a rollout worker
    (transport_memory_child.py): its shard plus one bucket, the gathered buffer sent as it is; the
    same publish holding a copy of each bucket shows a second one, so the measurement sees it.
    glibc returns every freed block of 64 KiB or more at once (MALLOC_MMAP_THRESHOLD_), so the
    peak resident set is the peak of live memory (alone: 40.1 MiB for a 40 MiB bucket; 44.6 on a
    loaded machine)."""
    import json

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    rc, out, err = torchrun("transport_memory_child.py", 2, [], tmp_path, timeout=180)
    assert rc == 0, out[-2000:] + err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    print(got)
    assert got["rank_major_mib"] <= 1.25 * got["bucket_mib"] + 2, got
    assert got["control_mib"] >= 1.8 * got["bucket_mib"], got
