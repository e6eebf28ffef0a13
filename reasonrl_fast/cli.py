"""The wrapper every `python -m reasonrl_fast.<command>` runs its work in: a UserError (bad
input, a refused checkpoint, ...) becomes one line `error: <message>` on stderr and exit status
2, the status argparse gives a bad argument; a Ctrl-C (KeyboardInterrupt) becomes one line
`interrupted` and exit status 130, the shell's 128 + SIGINT; anything else is a bug and keeps its
traceback."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

from reasonrl_fast.errors import UserError, one_line

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 128 + 2  # 128 + SIGINT, what a shell reports for a process Ctrl-C ended


def main(fn: Callable[[list[str]], Any], argv: list[str] | None = None) -> Any:
    """`fn(argv)` (argv: sys.argv[1:] when None); its UserError or a Ctrl-C ends the process as
    above."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return fn(argv)
    except UserError as e:
        print(f"error: {one_line(e) or type(e).__name__}", file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR) from None
    except KeyboardInterrupt:  # the user stopped it: their own act needs no traceback
        print("interrupted", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None


def positive_number(value: str) -> float:
    """An argparse `type` for a size or a time limit: a finite number above 0 (inf would let a
    wait run for ever, and nan compares false with every bound, so it passes range checks)."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"{value!r}: expected a finite number above 0")
    return number
