"""A resumed run trains with the optimizer settings it is given, not the checkpoint's, and one
that changes a setting the checkpoint cannot do without is refused before it touches the run
directory (runtime/resume.py)."""

from tests.helpers.train import read_metrics


def test_resume_applies_a_new_lr_and_refuses_a_new_algorithm(train, tmp_path):
    out = tmp_path / "run"
    base = ["algo=grpo", "trainer.val_every=0", "trainer.save_every=2", f"trainer.output_dir={out}"]
    train(base + ["trainer.steps=2", "optim.lr=1e-4"], tmp_path)
    assert [r["train/lr"] for r in read_metrics(out)] == [1e-4, 1e-4]

    p = train(base + ["trainer.steps=3", "optim.lr=3e-4", "optim.weight_decay=0.01"], tmp_path)
    assert "resume: optim.lr 0.0001 -> 0.0003" in p.stdout and "resume: optim.weight_decay 0 -> 0.01" in p.stdout
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["train/lr"] == 3e-4

    before = (out / "config.yaml").read_text()
    p = train(base[1:] + ["algo=flowrl", "trainer.steps=4"], tmp_path, check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "algo was 'grpo' in the checkpoint and is 'flowrl' now" in errors[0], p.stderr[-3000:]
    assert (out / "config.yaml").read_text() == before
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
