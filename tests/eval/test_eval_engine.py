"""A third rollout engine, registered in one place, runs the eval command end to end: on a tiny
model directory of the embedded task, on the test's local Ray instance (e2e by its fixture), with
an engine that answers every prompt with the same text (tests/helpers/fake_rollout.py)."""

import json

from reasonrl_fast.config import load_config
from reasonrl_fast.eval.run import run
from reasonrl_fast.rollout import ROLLOUTS
from tests.helpers import fake_rollout
from tests.helpers.model_dirs import model_dir


def test_eval_with_a_registered_third_engine(ray_local, tmp_path, monkeypatch):
    monkeypatch.setitem(ROLLOUTS, "fake", "tests.helpers.fake_rollout:FakeSpec")  # the one place
    out = tmp_path / "eval"
    cfg = load_config(None, [f"model.path={model_dir(tmp_path / 'm')}", f"eval.output_dir={out}", "eval.n=2",
                             "data.val_size=3", "eval.prompts_per_batch=2", "trainer.workers_per_node=1",
                             "reward.num_workers=1", "rollout.backend=fake"])
    lines = []
    summary = run(cfg, log=lines.append)
    assert f"[eval] rollout: {fake_rollout.VERSION}" in lines  # its preflight, asked by eval
    assert summary["backend"] == "fake" and summary["per_source"]["addition"]["prompts"] == 3
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    # every sample is the engine's, decoded and scored: two 2-digit numbers never sum to 0
    assert [(s["prompt_index"], s["sample"]) for s in samples] == [(i, j) for i in range(3) for j in range(2)]
    assert {(s["response"], s["answer"], s["acc"]) for s in samples} == {(fake_rollout.ANSWER, "0", False)}
    assert summary["overall"]["mean@2"] == 0.0
