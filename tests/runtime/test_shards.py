"""runtime/shards.py, the rank-major layout of dim-0 shards, against torch.chunk (the split FSDP2
makes) on shapes that do not split evenly: fewer rows than shards, one row, 1-D tensors."""

import pytest
import torch

from reasonrl_fast.runtime.shards import slots, unpack


def _rank_major(tensors, world):
    """The buffer an all-gather of each rank's packed torch.chunk pieces produces."""
    sizes = slots([tuple(t.shape) for t in tensors], world)
    rows = []
    for k in range(world):
        for t, size in zip(tensors, sizes):
            pieces = t.chunk(world) if world > 1 else (t,)
            piece = pieces[k].reshape(-1) if k < len(pieces) else t.new_empty(0)
            rows += [piece, t.new_zeros(size - piece.numel())]
    return torch.cat(rows)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("seed", range(3))
def test_unpack_cuts_the_full_tensors_out_of_the_rank_major_buffer(world, seed):
    g = torch.Generator().manual_seed(seed)
    shapes = [(1,), (3, 4), (7,), (2, 3, 5), (int(torch.randint(1, 12, (1,), generator=g)), 6), (world * 2, 3)]
    tensors = [torch.randn(s, generator=g) for s in shapes]
    buf = _rank_major(tensors, world)
    got = list(unpack(buf, shapes, world))
    assert len(got) == len(tensors)
    for t, u in zip(tensors, got):
        assert torch.equal(t, u)


def test_no_copy_where_a_tensor_lies_whole():
    t = torch.randn(8, 3)
    buf = _rank_major([t], 4)
    assert next(unpack(buf, [(8, 3)], 4)).data_ptr() == buf.data_ptr()  # even shards of one tensor: a view
    one = torch.randn(10)
    assert next(unpack(one, [(4,), (6,)], 1)).data_ptr() == one.data_ptr()  # one shard: views


def test_a_buffer_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match=r"a rank-major buffer of 12 elements for 1 tensors in 2 shards, which take 16"):
        list(unpack(torch.zeros(12), [(7, 2)], 2))
