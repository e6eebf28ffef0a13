"""data.task=genrm end to end with the tiny settings: warm start on verdicts, GRPO on the GenRM
reward, validation by class."""

from tests.helpers.train import read_metrics

GENRM = ["data.task=genrm", "algo=grpo", "data.max_prompt_length=28", "rollout.max_new_tokens=17",
         "trainer.steps=2"]


def test_genrm_task_trains_and_validates_by_class(train, tmp_path):
    out = tmp_path / "run"
    train([*GENRM, f"trainer.output_dir={out}"], tmp_path)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    validated = [r for r in rows if "val/accuracy" in r]
    assert [r["step"] for r in validated] == [0, 2]  # trainer.val_every=2
    for r in validated:
        assert 0 <= r["val/accuracy_no_error"] <= 1 and 0 <= r["val/accuracy_flawed"] <= 1
        assert r["val/accuracy"] <= r["val/class_accuracy"] <= 1  # the exact index is of the right class
        assert "val/flawed_positive_ratio" not in r  # an addition metric, not a GenRM one
    steps = rows[1:]
    assert all(r["reward/errors"] == 0 and r["reward/timeouts"] == 0 for r in steps)
    assert all(-1 <= r["reward/mean"] <= 1 for r in steps)
    # an unreadable verdict costs -1 under the GenRM reward (the math scorer never goes below 0):
    # a 5-step warm start leaves most verdicts unreadable
    assert min(r["reward/mean"] for r in steps) < 0
