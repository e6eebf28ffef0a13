"""Small helpers several wings share, one home each: the nearest-rank quantile of the latency
metrics, and reading a run's metrics.jsonl (the trainer's resume, plot, benchmarks, tests)."""

from __future__ import annotations

import json
import math
import os
import warnings


def quantile(xs: list[float], q: float) -> float:
    """Nearest-rank quantile (0 for an empty list: a step that measured nothing)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


METRICS_FILE = "metrics.jsonl"


def read_metrics(path: str) -> list[dict]:
    """The rows of a metrics.jsonl (`path` is the file or the run directory holding it). A cut-off
    last line (the process died mid-write) is dropped with a warning; a bad line anywhere else
    means the file is damaged: a ValueError naming the line."""
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILE)
    with open(path) as f:
        lines = f.read().split("\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as e:
            if any(rest.strip() for rest in lines[i + 1:]):
                raise ValueError(f"{path}, line {i + 1}: not valid JSON ({e}); the file is damaged") from None
            warnings.warn(f"{path}, line {i + 1}: dropping a cut-off last line", stacklevel=2)
    return rows
