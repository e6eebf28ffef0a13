"""A deliberately stale rollout (rollout.sync_every=4): the steps sampled by an engine some
updates behind show a gap to the trainer's log-probs far above the synced steps', and with the
correction on (token_tis) the embedded default still learns (the hf backend; a full default
run, about two minutes)."""

import json

from reasonrl_fast.util import quantile, read_metrics


def test_stale_rollout_shows_its_gap_and_still_learns_with_the_correction(train, tmp_path):
    out = tmp_path / "run"
    train(["rollout.sync_every=4", "rollout.correction=token_tis", f"trainer.output_dir={out}"], tmp_path,
          timeout=600, tiny=False)
    rows = [r for r in read_metrics(out) if "rollout/logprob_diff_mean" in r]
    # the engine is synced after steps 4, 8, ...: steps 1, 5, 9, ... sample from the current policy
    fresh = [r["rollout/logprob_diff_mean"] for r in rows if r["step"] % 4 == 1]
    stale = [r["rollout/logprob_diff_mean"] for r in rows if r["step"] % 4 != 1]
    assert quantile(fresh, 0.5) < 1e-4, quantile(fresh, 0.5)
    assert quantile(stale, 0.5) > 100 * quantile(fresh, 0.5) and quantile(stale, 0.5) > 1e-3, quantile(stale, 0.5)
    assert all("rollout/is_weight_mean" in r and "rollout/is_clipped_frac" in r for r in rows)
    val = [r["val/accuracy"] for r in read_metrics(out) if "val/accuracy" in r]
    # learning: the last three validations (steps 100-150) against the warm start's
    assert sum(val[-3:]) / 3 - val[0] >= 0.15, val
    print(json.dumps({"fresh": quantile(fresh, 0.5), "stale": quantile(stale, 0.5), "val": val}))
