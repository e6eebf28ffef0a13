"""A deliberately stale rollout (rollout.sync_every=4): the steps sampled by an engine some
updates behind show a gap to the trainer's log-probs far above the synced steps' (12 steps, the
hf backend), and with the correction on (token_tis) the embedded default still learns (a full
default run, about two minutes: a learning check of the `slow` tier)."""

import json

import pytest

from reasonrl_fast.util import quantile, read_metrics

STALE = ["rollout.sync_every=4", "rollout.correction=token_tis"]


def _run_and_check_the_gap(train, tmp_path, *args: str) -> list[dict]:
    """The metrics rows of a run with the stale rollout; its gap checked."""
    out = tmp_path / "run"
    train([*STALE, *args, f"trainer.output_dir={out}"], tmp_path, timeout=600, tiny=False)
    rows = read_metrics(out)
    gaps = [r for r in rows if "rollout/logprob_diff_mean" in r]
    # the engine is synced after steps 4, 8, ...: steps 1, 5, 9, ... sample from the current policy
    fresh = [r["rollout/logprob_diff_mean"] for r in gaps if r["step"] % 4 == 1]
    stale = [r["rollout/logprob_diff_mean"] for r in gaps if r["step"] % 4 != 1]
    assert fresh and stale, gaps
    assert quantile(fresh, 0.5) < 1e-4, quantile(fresh, 0.5)
    assert quantile(stale, 0.5) > 100 * quantile(fresh, 0.5) and quantile(stale, 0.5) > 1e-3, quantile(stale, 0.5)
    assert all("rollout/is_weight_mean" in r and "rollout/is_clipped_frac" in r for r in gaps)
    print(json.dumps({"fresh": quantile(fresh, 0.5), "stale": quantile(stale, 0.5)}))
    return rows


def test_a_stale_rollout_shows_its_gap(train, tmp_path):
    _run_and_check_the_gap(train, tmp_path, "trainer.steps=12", "trainer.val_every=0")


@pytest.mark.slow
def test_stale_rollout_still_learns_with_the_correction(train, tmp_path):
    rows = _run_and_check_the_gap(train, tmp_path)
    val = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
    # learning: the last three validations (steps 100-150) against the warm start's
    assert sum(val[-3:]) / 3 - val[0] >= 0.15, val
    print(json.dumps({"val": val}))
