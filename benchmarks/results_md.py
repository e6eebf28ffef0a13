"""Write a benchmark's table into RESULTS.md between its markers (shared by the benchmarks; no
heavy imports, so a benchmark that needs neither torch nor the compiled ops can use it)."""

from __future__ import annotations

import os
import re


def write_section(path: str, body: str, marker: str) -> None:
    """Replace the text between `<!-- marker:begin -->` and `<!-- marker:end -->` in `path`
    (append the block when the markers are absent)."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    text = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    block = f"{begin}\n{body}\n{end}"
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def publish(body: str, path: str | None, marker: str) -> None:
    """Print a benchmark's table, and with `path` (its --write) put it between its markers there."""
    print(body)
    if path:
        write_section(path, body, marker)
