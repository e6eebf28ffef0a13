"""group_advantage against verl's loop over groups, on every device (DEVICES); the math is in
docs/math.md §Group advantage."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reasonrl_fast.ops import group_advantage
from reasonrl_fast.ops import reference as ref
from tests.helpers.childproc import child_outcomes
from tests.helpers.ops import DEVICES, OPS, assert_no_recompile, check_typed_outcomes, cuda_only, opcheck


def _check(rewards, ids, eps=1e-6, norm_by_std=True):
    out = group_advantage(rewards, ids, eps=eps, norm_by_std=norm_by_std)
    exp = ref.group_advantage(rewards.double(), ids, eps=eps, norm_by_std=norm_by_std)
    assert out.dtype == torch.float32 and out.shape == rewards.shape
    torch.testing.assert_close(out.double(), exp, rtol=1e-5, atol=1e-5, equal_nan=True)
    return out


@settings(max_examples=60, deadline=None)
@given(
    rewards=st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=1, max_size=40),
    data=st.data(),
    norm_by_std=st.booleans(),
)
def test_property_arbitrary_groups(rewards, data, norm_by_std):
    # Non-contiguous, unsorted, negative and huge ids; singleton groups arise naturally.
    pool = data.draw(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=8, unique=True))
    ids = data.draw(st.lists(st.sampled_from(pool), min_size=len(rewards), max_size=len(rewards)))
    _check(torch.tensor(rewards), torch.tensor(ids), norm_by_std=norm_by_std)


@settings(max_examples=30, deadline=None)
@given(value=st.floats(-100, 100, allow_nan=False), k=st.integers(2, 16))
def test_property_equal_rewards_give_zero(value, k):
    out = _check(torch.full((k,), value, dtype=torch.float64), torch.zeros(k, dtype=torch.long))
    assert (out == 0).all()


def test_hand_computed():
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 3.0])
    ids = torch.tensor([7, 7, 2, 2, 9])
    out = group_advantage(r, ids, eps=0.0)
    s = 2**-0.5  # std of {1, 0} with Bessel's correction
    torch.testing.assert_close(out, torch.tensor([0.5 / s, -0.5 / s, 0.5 / s, -0.5 / s, 3.0]))
    # singleton: mean 0, std 1; Dr.GRPO: r - mean
    torch.testing.assert_close(
        group_advantage(r, ids, norm_by_std=False), torch.tensor([0.5, -0.5, 0.5, -0.5, 3.0])
    )


def test_large_batch_and_dtypes():
    ids = torch.randint(0, 1024, (8192,))
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        _check(torch.randn(8192).to(dtype), ids.to(torch.int32))


def test_nan_reward_stays_in_its_group():
    r = torch.tensor([1.0, float("nan"), 0.0, 1.0])
    out = group_advantage(r, torch.tensor([0, 0, 1, 1]))
    assert torch.isnan(out[:2]).all() and torch.isfinite(out[2:]).all()


def test_empty():
    assert group_advantage(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_opcheck(device, norm_by_std):
    r, ids = torch.randn(33, device=device), torch.randint(0, 5, (33,), device=device)
    opcheck(OPS.group_advantage, (r, ids, 1e-6, norm_by_std))
    opcheck(OPS.group_advantage, (torch.randn(9, device=device),
                                  torch.tensor([0, 1, 0, 2, 2, 2, 5, 1, 0], device=device), 1e-6, True))


@pytest.mark.heavy  # an inductor compile: C++ codegen on CPU
def test_compile_inductor():
    r, ids = torch.randn(33), torch.randint(0, 5, (33,))
    f = torch.compile(lambda a, b: group_advantage(a, b) * 2, fullgraph=True)
    torch.testing.assert_close(f(r, ids), group_advantage(r, ids) * 2)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_dynamic_does_not_recompile(device):
    assert_no_recompile(lambda r, g: group_advantage(r, g) * 2,
                        lambda n: (torch.randn(n, device=device), torch.randint(0, 3, (n,), device=device)))


def test_recompile_check_can_fail():
    """The check above would see a recompile: without dynamic shapes each size is a new graph."""
    with pytest.raises(Exception, match="[Rr]ecompil"):
        assert_no_recompile(lambda r, g: group_advantage(r, g) * 2,
                            lambda n: (torch.randn(n), torch.randint(0, 3, (n,))), dynamic=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B", [1, 7, 1000, 8192, 70000])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_matches_reference_and_cpu_kernel(device, B, norm_by_std):
    """Offset rewards (+100: a one-pass variance would cancel) and sparse, negative ids; the
    reference loop is slow, so above 1000 rows the CPU kernel stands in for it."""
    r = torch.randn(B, dtype=torch.float64) + 100
    g = torch.randint(0, max(1, B // 5), (B,)) * 7 - 3
    got = group_advantage(r.to(device), g.to(device), norm_by_std=norm_by_std)
    want = OPS.group_advantage(r, g, 1e-6, norm_by_std)  # CPU kernel
    if B <= 1000:
        torch.testing.assert_close(
            want.double(), ref.group_advantage(r, g, norm_by_std=norm_by_std), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
    assert got.dtype == torch.float32 and got.device.type == device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B", [64, 70000])  # CUDA: the tiled kernel and the ATen path above kTiledMax
@pytest.mark.parametrize("rdtype", [torch.float64, torch.float32])
def test_equal_rewards_give_exactly_zero(device, B, rdtype):
    # Groups of 8 equal rewards (0.1, whose mean rounds): the correction pass gives exactly 0,
    # and with eps = 0 exactly 0 / 0 = NaN (not noise / noise, of order 1), on every device.
    g = torch.arange(B) // 8
    r = (0.1 * (1 + g % 5).double()).to(rdtype)  # float32 sums of 8 are exact in double
    for eps in (1e-6, 0.0):
        got = group_advantage(r.to(device), g.to(device), eps=eps).cpu()
        want = OPS.group_advantage(r, g, eps, True)
        assert torch.equal(got.isnan(), want.isnan())
        assert (got == 0).all() if eps else got.isnan().all()
        assert (group_advantage(r.to(device), g.to(device), norm_by_std=False) == 0).all()


class TestBadInput:
    def test_length_mismatch(self):
        with pytest.raises(ValueError, match="group_ids"):
            group_advantage(torch.randn(4), torch.zeros(5, dtype=torch.long))

    def test_2d_rewards(self):
        with pytest.raises(ValueError, match=r"\[B\]"):
            group_advantage(torch.randn(4, 2), torch.zeros(4, 2, dtype=torch.long))

    def test_float_ids(self):
        with pytest.raises(TypeError, match="integer"):
            group_advantage(torch.randn(4), torch.zeros(4))

    def test_integer_rewards(self):
        with pytest.raises(TypeError, match="floating"):
            group_advantage(torch.ones(4, dtype=torch.long), torch.zeros(4, dtype=torch.long))

    def test_negative_eps(self):
        with pytest.raises(ValueError, match="eps"):
            group_advantage(torch.randn(4), torch.zeros(4, dtype=torch.long), eps=-1.0)


def test_equal_rewards_with_eps_zero():
    # The correction pass makes the mean exact, so a - mean is exactly 0 and 0 / (0 + 0) is NaN
    # (not rounding noise / rounding noise, of order 1); the CUDA kernel must agree.
    r = torch.full((8,), 0.1)
    out = group_advantage(r, torch.zeros(8, dtype=torch.long), eps=0.0)
    assert torch.isnan(out).all()
    assert (group_advantage(r, torch.zeros(8, dtype=torch.long)) == 0).all()


@pytest.mark.proc
def test_direct_kernel_calls_reject_bad_input():
    # torch.ops.reasonrl_fast.group_advantage skips the Python wrapper: the kernel checks every
    # argument. In a child process, so an out-of-bounds read fails this test only.
    lines = child_outcomes("""
        r, g = torch.randn(6), torch.tensor([0, 1, 0, 1, 2, 2])
        cases = [
            ("no exception", r, g, 1e-6),
            ("ValueError", r[None], g, 1e-6),
            ("ValueError", r, g[None], 1e-6),
            ("ValueError", r, g[:5], 1e-6),
            ("ValueError", r[:1], torch.zeros(20_000_000, dtype=torch.int32), 1e-6),
            ("ValueError", r, g, -1.0),
            ("ValueError", r, g, float("nan")),
            ("TypeError", r.long(), g, 1e-6),
            ("TypeError", r.to(torch.float8_e5m2), g, 1e-6),
            ("TypeError", r, g.float(), 1e-6),
            ("TypeError", r, g.bool(), 1e-6),
            ("ValueError", r, g.to("meta"), 1e-6),
        ]
        for want, *args in cases:
            print(want + "|" + outcome(ops.group_advantage, *args, True))
    """)
    assert len(lines) == 12
    for line in lines:
        want, got = line.split("|", 1)
        assert got.split(":")[0] == want, line


@pytest.mark.proc
@cuda_only
def test_direct_kernel_calls_reject_bad_input_cuda():
    # The CUDA kernel checks sizes, dtypes and devices itself: a mismatch raises the promised
    # Python exception, never an illegal memory access (hence the child process).
    lines = child_outcomes("""
        B = 3
        r, ids = torch.rand(B, device="cuda"), torch.arange(B, device="cuda")
        cases = [("no exception", lambda: ops.group_advantage(r, ids, 1e-6, True)),
                 ("ValueError", lambda: ops.group_advantage(r, ids.cpu(), 1e-6, True)),
                 ("ValueError", lambda: ops.group_advantage(r, ids[:-1], 1e-6, True)),
                 ("TypeError", lambda: ops.group_advantage(r, ids.float(), 1e-6, True))]
        for want, fn in cases:
            print(want + "|" + outcome(fn))
        torch.cuda.synchronize()
    """)
    check_typed_outcomes(lines, 4)
