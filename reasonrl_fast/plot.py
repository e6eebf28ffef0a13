"""`python -m reasonrl_fast.plot RUN_DIR [RUN_DIR ...] -o out.png`

Training curves of one or more runs, one subplot per metric against the step, one line per run
(labelled by the run directory's name and its algo). A metric no run logged is left out; one that
only some runs logged is drawn for those (validation metrics only at their steps)."""

from __future__ import annotations

import argparse
import json
import os
import sys

METRICS = ("reward/mean", "accuracy/mean", "val/accuracy", "val/flawed_positive_ratio", "entropy/mean",
           "response_length/mean", "time/step_s")


class PlotError(ValueError):
    """A run directory that cannot be plotted; the message names it."""


def read_run(run_dir: str) -> tuple[str, list[dict]]:
    """(label, metric rows) of a run directory: its metrics.jsonl, labelled `name (algo)`."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise PlotError(f"{run_dir}: no metrics.jsonl (not a run directory, or a run that logged nothing yet)")
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise PlotError(f"{path}:{lineno}: not valid JSON") from None
            if isinstance(row, dict) and "step" in row:
                rows.append(row)
    name = os.path.basename(os.path.normpath(run_dir))
    algo = _algo(os.path.join(run_dir, "config.yaml"))
    return (f"{name} ({algo})" if algo else name), rows


def _algo(config_path: str) -> str:
    if not os.path.isfile(config_path):
        return ""
    from omegaconf import OmegaConf

    try:
        return str(OmegaConf.load(config_path).get("algo", "") or "")
    except Exception:  # noqa: BLE001 - a label is not worth failing the plot
        return ""


def plot(run_dirs: list[str], out: str, metrics: tuple[str, ...] = METRICS) -> list[str]:
    """Write the figure to `out` (PNG); returns the metrics drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not run_dirs:
        raise PlotError("no run directory given")
    runs = [read_run(d) for d in run_dirs]
    drawn = [m for m in metrics if any(m in r for _, rows in runs for r in rows)]
    if not drawn:
        raise PlotError(f"none of {', '.join(metrics)} is in {', '.join(run_dirs)}")
    cols = min(3, len(drawn))
    nrows = -(-len(drawn) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3.2 * nrows), squeeze=False)
    for ax, metric in zip(axes.flat, drawn):
        for label, rows in runs:
            pts = [(r["step"], r[metric]) for r in rows if isinstance(r.get(metric), (int, float))]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=label, marker="o" if len(pts) < 30 else None, markersize=3)
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(drawn):]:
        ax.set_visible(False)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return drawn


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m reasonrl_fast.plot",
                                description="Plot training curves of one or more run directories.")
    p.add_argument("run_dirs", nargs="+", help="run directories (each with metrics.jsonl)")
    p.add_argument("-o", "--output", required=True, help="PNG file to write")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        plot(args.run_dirs, args.output)
    except PlotError as e:
        sys.exit(f"error: {e}")
    print(args.output)


if __name__ == "__main__":
    main()
