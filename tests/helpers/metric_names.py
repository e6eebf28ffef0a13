"""The metrics contract of docs/trainer.md §Metrics, for the tests that check a run's names
against it (tests/trainer/test_metric_names.py in-process, tests/trainer/test_e2e.py on a real
run): every metric is `<area>/<name>` and listed in that section's table; `step` is a row key."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "trainer.md"
ROW_KEYS = {"step"}
NAME = re.compile(r"^[a-z][a-z0-9_]*/([a-z0-9_]+/)?[a-z0-9_@<>]+$")  # val/<set>/<name>: a set's own


def documented() -> set[str]:
    """The names of the §Metrics table of docs/trainer.md."""
    text = DOC.read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"^\| `([^`]+)` \|", section, re.M)
    assert names, "docs/trainer.md §Metrics lists no metric"
    return set(names)


def as_documented(name: str) -> str:
    """`val/pass@4` -> `val/pass@<k>`, `val/aime24/mean@32` -> `val/<set>/mean@<k>`: the table
    names the k-dependent metrics, and those of a validation set, once."""
    return re.sub(r"^val/[a-z0-9_]+/", "val/<set>/", re.sub(r"@\d+$", "@<k>", name))


def problems(names: set[str], listed: set[str]) -> list[str]:
    """What the contract refuses in a run's `names`."""
    out = []
    for name in sorted(names - ROW_KEYS):
        if not NAME.match(name):
            out.append(f"{name!r} is not <area>/<name>")
        elif as_documented(name) not in listed:
            out.append(f"{name!r} is not in docs/trainer.md §Metrics")
    return out
