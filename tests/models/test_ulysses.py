"""Ulysses sequence parallel (models/ulysses.py): on two gloo ranks, a decoder run as two shares
of packed rows gives the whole forward's hidden states, and the actor (trainer/policy.py) the
whole row's log-probs and entropies (plain and fused head), and summed over the ranks the whole
backward's gradients (float64); the head check and a row's sequence bounds in one process."""

import pytest
import torch

from reasonrl_fast.layout.resolve import check_heads
from reasonrl_fast.models.ulysses import kv_repeats, sequence_bounds
from tests.helpers.procs import torchrun


@pytest.mark.proc
def test_two_ranks_give_the_whole_forward_and_backward(tmp_path):
    rc, out, err = torchrun("ulysses_child.py", 2, [], tmp_path, timeout=240)
    assert rc == 0, out[-2000:] + err[-4000:]
    assert "OK 9 rows: hidden states, log-probs, entropies, log Z and summed gradients equal the whole forward's" in out


def test_key_value_heads_are_repeated_the_fewest_times_that_split():
    assert kv_repeats(4, 8) == 2 and kv_repeats(8, 8) == 1 and kv_repeats(2, 2) == 1 and kv_repeats(1, 2) == 2
    assert kv_repeats(4, 6) == 3  # lcm(4, 6) = 12 heads
    assert check_heads(40, 8) is None and check_heads(12, 4) is None  # Qwen2.5-32B at 8, 1.5B at 4
    assert check_heads(28, 8) == "28 attention heads, which 8 sequence-parallel ranks do not divide"  # 7B at 8


def test_a_rows_sequences_are_where_its_positions_restart():
    assert sequence_bounds(torch.tensor([[0, 1, 2, 0, 1, 0]])) == [(0, 3), (3, 5), (5, 6)]
    assert sequence_bounds(torch.tensor([[0, 1, 2, 3]])) == [(0, 4)]
    with pytest.raises(ValueError, match="restart at 0"):
        sequence_bounds(torch.tensor([[1, 2, 0]]))


