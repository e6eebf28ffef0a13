"""`python -m reasonrl_fast.plot`: a PNG from two synthetic run directories (metrics in some
runs only), a clear error for a directory without metrics.jsonl (a few seconds), and the
session's shared trained run drawn."""

import json
import struct
import subprocess
import sys

import pytest

from reasonrl_fast.plot import PlotError, plot


def _run_dir(path, algo, steps, with_val):
    path.mkdir()
    (path / "config.yaml").write_text(f"algo: {algo}\ntrainer:\n  steps: {steps}\n")
    with open(path / "metrics.jsonl", "w") as f:
        for s in range(steps + 1):
            row = {"step": s}
            if s:
                row.update({"reward/mean": 0.1 * s, "accuracy/mean": 0.05 * s, "time/step_s": 1.0 + s % 2})
                if algo == "flowrl":
                    row["entropy/mean"] = 1.0 / s
            if with_val and s % 2 == 0:
                row["val/accuracy"] = 0.5 + 0.01 * s
            f.write(json.dumps(row) + "\n")


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24]), len(data)


def test_plot_two_runs(tmp_path):
    _run_dir(tmp_path / "a", "flowrl", 6, with_val=True)
    _run_dir(tmp_path / "b", "grpo", 4, with_val=False)
    out = tmp_path / "figs" / "curves.png"
    drawn = plot([str(tmp_path / "a"), str(tmp_path / "b")], str(out))
    # response_length/mean is in neither run: skipped; entropy and val only in run a: drawn
    assert drawn == ["reward/mean", "accuracy/mean", "val/accuracy", "entropy/mean", "time/step_s"]
    (w, h), size = _png_size(out)
    assert w >= 600 and h >= 300, (w, h)   # 3 x 2 subplots at 100 dpi
    assert size > 20_000, size             # drawn, not blank


@pytest.mark.proc
def test_plot_cli_errors(tmp_path):
    _run_dir(tmp_path / "a", "grpo", 2, with_val=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlotError, match="empty: no metrics.jsonl"):
        plot([str(tmp_path / "a"), str(tmp_path / "empty")], str(tmp_path / "x.png"))
    p = subprocess.run([sys.executable, "-m", "reasonrl_fast.plot", str(tmp_path / "empty"), "-o",
                        str(tmp_path / "x.png")], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "no metrics.jsonl" in p.stderr and str(tmp_path / "empty") in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "x.png").exists()


def test_a_damaged_metrics_line_is_a_plot_error_and_a_cut_off_last_line_is_dropped(tmp_path):
    _run_dir(tmp_path / "a", "grpo", 3, with_val=False)
    metrics = tmp_path / "a" / "metrics.jsonl"
    good = metrics.read_text()
    metrics.write_text(good + '{"step": 4, "reward/me')  # the writer died mid-line: still plotted
    with pytest.warns(UserWarning, match="line 5: dropping a cut-off last line"):
        assert "reward/mean" in plot([str(tmp_path / "a")], str(tmp_path / "cut.png"))
    lines = good.splitlines()
    metrics.write_text("\n".join([lines[0], "{oops", *lines[1:]]) + "\n")  # damaged mid-file
    with pytest.raises(PlotError, match=r"metrics.jsonl, line 2: not valid JSON"):
        plot([str(tmp_path / "a")], str(tmp_path / "bad.png"))
    assert not (tmp_path / "bad.png").exists()


@pytest.mark.proc
def test_summary_table(tmp_path):
    _run_dir(tmp_path / "a", "flowrl", 6, with_val=True)
    _run_dir(tmp_path / "b", "grpo", 4, with_val=False)
    out = tmp_path / "s.md"
    p = subprocess.run([sys.executable, "-m", "reasonrl_fast.plot", str(tmp_path / "a"), str(tmp_path / "b"),
                        "-o", str(tmp_path / "c.png"), "--summary", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    lines = out.read_text().splitlines()
    # val/accuracy at steps 0 and 6; time/step_s alternates 2, 1, 2, ... (steps 1..6: mean 1.5;
    # steps 1..4: mean 1.5); flawed ratio and GenRM columns: no run logged them
    assert lines[0] == "| run | val/accuracy | time/step_s (mean) |"
    assert lines[2] == "| a (flowrl) | 0.500 -> 0.560 | 1.500 |"
    assert lines[3] == "| b (grpo) | - | 1.500 |"


def test_plot_a_trained_run(trained_run, tmp_path):
    """The metrics a real (FlowRL, addition) run writes are the ones the plot draws."""
    out = tmp_path / "run.png"
    drawn = plot([str(trained_run.dir)], str(out))
    assert drawn == ["reward/mean", "accuracy/mean", "val/accuracy", "val/flawed_positive_ratio",
                     "entropy/mean", "response_length/mean", "time/step_s"]
    (w, h), size = _png_size(out)
    assert w >= 600 and h >= 300 and size > 20_000, (w, h, size)


def test_no_output_is_written_onto_an_input_or_in_a_format_matplotlib_lacks(tmp_path, monkeypatch, capsys):
    """--summary onto a run's metrics.jsonl (or config.yaml, or the figure), by any name, and a
    figure name matplotlib cannot write are refused before anything is written: the run's files
    stay as they were and no figure appears."""
    from reasonrl_fast.plot import main

    _run_dir(tmp_path / "a", "grpo", 2, with_val=False)
    metrics, config = tmp_path / "a" / "metrics.jsonl", tmp_path / "a" / "config.yaml"
    before = metrics.read_bytes(), config.read_bytes()
    (tmp_path / "m.md").symlink_to(metrics)
    monkeypatch.chdir(tmp_path)
    cases = [(["-o", "p.png", "--summary", str(metrics)], "an input of the plot"),
             (["-o", "p.png", "--summary", "m.md"], "an input of the plot"),
             (["-o", "p.png", "--summary", "a/../a/config.yaml"], "an input of the plot"),
             (["-o", "p.png", "--summary", "p.png"], "is the --output file"),
             (["-o", "p.txt"], "cannot write a figure as .txt"),
             (["-o", "p"], "without an extension")]
    for flags, says in cases:
        with pytest.raises(SystemExit) as e:
            main(["a", *flags])
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err and len(err.splitlines()) == 1, err
        assert (metrics.read_bytes(), config.read_bytes()) == before
    assert not any(p.name.startswith("p") for p in tmp_path.iterdir())
    main(["a", "-o", "p.svg"])  # another format matplotlib writes
    assert (tmp_path / "p.svg").read_bytes().lstrip().startswith(b"<?xml")


def test_metrics_nested_too_deeply_or_not_utf8_are_named(tmp_path):
    _run_dir(tmp_path / "a", "grpo", 2, with_val=False)
    metrics = tmp_path / "a" / "metrics.jsonl"
    good = metrics.read_text()
    metrics.write_text("[" * 100_000 + "\n" + good)
    with pytest.raises(PlotError, match=r"metrics.jsonl, line 1: not valid JSON \(nested too deeply\)"):
        plot([str(tmp_path / "a")], str(tmp_path / "x.png"))
    metrics.write_text(good + "[" * 100_000)  # as the last line too: no write cut short leaves that
    with pytest.raises(PlotError, match=r"metrics.jsonl, line 4: not valid JSON \(nested too deeply\)"):
        plot([str(tmp_path / "a")], str(tmp_path / "x.png"))
    metrics.write_bytes(good.encode() + b"\xff\xfe\n")
    with pytest.raises(PlotError, match=r"metrics.jsonl: not a UTF-8 text file"):
        plot([str(tmp_path / "a")], str(tmp_path / "x.png"))
