"""`python -m reasonrl_fast.plot RUN_DIR [RUN_DIR ...] -o out.png [--summary table.md]`

Training curves of one or more runs, one subplot per metric against the step, one line per run
(labelled by the run directory's name and its algo). A metric no run logged is left out; one that
only some runs logged is drawn for those (validation metrics only at their steps).

`--summary` also writes the runs side by side as a Markdown table (`-`: stdout): each validation
metric at the first and the last validation, and the step metrics of SUMMARY_MEANS averaged over
the steps that logged them.

Neither output may be one of the runs' own files (metrics.jsonl, config.yaml) or the other
output: such a name is refused before anything is written."""

from __future__ import annotations

import argparse
import os

from reasonrl_fast import cli
from reasonrl_fast.errors import UserError
from reasonrl_fast.util import METRICS_FILE, read_metrics, same_file

METRICS = ("reward/mean", "accuracy/mean", "val/accuracy", "val/flawed_positive_ratio", "entropy/mean",
           "response_length/mean", "time/step_s")

SUMMARY_VAL = ("val/accuracy", "val/flawed_positive_ratio")
SUMMARY_MEANS = ("fapo/flagged_ratio", "genrm/checker_agreement", "genrm/checker_step_agreement", "time/step_s")


class PlotError(UserError, ValueError):
    """A run directory that cannot be plotted; the message names it."""


def read_run(run_dir: str) -> tuple[str, list[dict]]:
    """(label, metric rows) of a run directory: its metrics.jsonl, labelled `name (algo)`."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.isfile(path):
        raise PlotError(f"{run_dir}: no metrics.jsonl (not a run directory, or a run that logged nothing yet)")
    try:
        rows = read_metrics(path)
    except ValueError as e:  # a damaged line (its message names the file and line)
        raise PlotError(str(e)) from None
    except OSError as e:
        raise PlotError(f"{path}: cannot read it ({e.strerror or e})") from None
    rows = [r for r in rows if isinstance(r, dict) and "step" in r]
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
    """Write the figure to `out` (PNG, or the format its extension names); returns the metrics
    drawn."""
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
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        fig.savefig(out, dpi=100)
    except OSError as e:  # a file where its directory should be, no permission, a full disk
        raise PlotError(f"--output {out}: cannot write the figure ({e.strerror or e})") from None
    except (ValueError, RuntimeError) as e:  # a format matplotlib lacks, or whose writer is missing (pgf: LaTeX)
        raise PlotError(f"--output {out}: cannot write the figure ({cli.one_line(e)})") from None
    finally:
        plt.close(fig)
    return drawn


def summary(run_dirs: list[str], val: tuple[str, ...] = SUMMARY_VAL,
            means: tuple[str, ...] = SUMMARY_MEANS) -> str:
    """The runs side by side, one row each: `first -> last` of each validation metric, and the
    mean over steps of each step metric; a column no run logged is left out, '-' where one run
    did not log it."""
    runs = [read_run(d) for d in run_dirs]

    def values(rows, m):
        return [r[m] for r in rows if isinstance(r.get(m), (int, float))]

    val = [m for m in val if any(values(rows, m) for _, rows in runs)]
    means = [m for m in means if any(values(rows, m) for _, rows in runs)]
    lines = ["| run | " + " | ".join([*val, *(f"{m} (mean)" for m in means)]) + " |",
             "|---" * (1 + len(val) + len(means)) + "|"]
    for label, rows in runs:
        cells = []
        for m in val:
            v = values(rows, m)
            cells.append(f"{v[0]:.3f} -> {v[-1]:.3f}" if v else "-")
        for m in means:
            v = values(rows, m)
            cells.append(f"{sum(v) / len(v):.3f}" if v else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def figure_formats() -> list[str]:
    """The file extensions matplotlib can write a figure as (png, pdf, svg, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def check_outputs(run_dirs: list[str], output: str, summary_path: str | None) -> None:
    """A PlotError, before anything is read or drawn, for an output that cannot be written as
    asked or would overwrite what the command did not write: a directory; a figure whose
    extension matplotlib cannot write (with none it would add .png and write another file than
    the one named); a run's own files (its metrics.jsonl, config.yaml), under any name; the
    figure and the table on one file."""
    outputs = [("--output", output)] + ([("--summary", summary_path)] if summary_path not in (None, "-") else [])
    for flag, path in outputs:
        if os.path.isdir(path):  # matplotlib would write PATH.png beside it
            raise PlotError(f"{flag} {path} is a directory: name the file to write")
    ext = os.path.splitext(output)[1].lstrip(".").lower()
    formats = figure_formats()
    if ext not in formats:
        raise PlotError(f"--output {output}: matplotlib cannot write a figure as "
                        f"{'.' + ext if ext else 'a file without an extension'}; name it .png (or one of "
                        f"{', '.join('.' + f for f in formats)})")
    inputs = [os.path.join(d, name) for d in run_dirs for name in (METRICS_FILE, "config.yaml")]
    for flag, path in outputs:
        hit = next((i for i in inputs if same_file(path, i)), None)
        if hit:
            raise PlotError(f"{flag} {path} is {hit}, an input of the plot: name another file to write")
    if len(outputs) == 2 and same_file(output, summary_path):
        raise PlotError(f"--summary {summary_path} is the --output file: name two files")


def main(argv: list[str] | None = None) -> None:
    cli.main(_main, argv)


def _main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m reasonrl_fast.plot",
                                description="Plot training curves of one or more run directories.")
    p.add_argument("run_dirs", nargs="+", help="run directories (each with metrics.jsonl)")
    p.add_argument("-o", "--output", required=True, help="the figure to write: out.png (or .pdf, .svg, ...)")
    p.add_argument("--summary", metavar="FILE", help="also write a Markdown table of the runs (-: stdout)")
    args = p.parse_args(argv)
    check_outputs(args.run_dirs, args.output, args.summary)
    plot(args.run_dirs, args.output)
    table = summary(args.run_dirs) if args.summary else ""
    print(args.output)
    if args.summary == "-":
        print(table, end="")
    elif args.summary:
        try:
            with open(args.summary, "w") as f:
                f.write(table)
        except OSError as e:
            raise PlotError(f"--summary {args.summary}: cannot write the table ({e.strerror or e})") from None
        print(args.summary)


if __name__ == "__main__":
    main()
