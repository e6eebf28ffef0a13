"""The wrapper every `python -m reasonrl_fast.<command>` runs its work in: a UserError (bad
input, a refused checkpoint, ...) becomes one line `error: <message>` on stderr and exit status
2, the status argparse gives a bad argument; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from reasonrl_fast.errors import UserError

EXIT_USER_ERROR = 2


def one_line(message: str) -> str:
    """The message on one line (some libraries' messages span several)."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def main(fn: Callable[[list[str]], Any], argv: list[str] | None = None) -> Any:
    """`fn(argv)` (argv: sys.argv[1:] when None); its UserError ends the process as above."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return fn(argv)
    except UserError as e:
        print(f"error: {one_line(e) or type(e).__name__}", file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR) from None
