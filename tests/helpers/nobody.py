"""The sandbox's launcher where uid 65534 can read it, for the tests that score as an
unprivileged caller (forked from this root test process, then setuid 65534).

Such a caller runs `python3 -I -S <launcher>` by path, as a real user's process runs the launcher
of its own checkout. A checkout in a private directory (a clone in `mktemp -d`, mode 0700) is out
of uid 65534's reach, and root's `os.access` cannot tell (it says yes to root). The launcher is one
standard-library script (rewards/_sandbox.py), so a copy in a world-readable directory serves:
the caller points `code._LAUNCHER` at it before it drops to uid 65534."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from reasonrl_fast.rewards import code

_copy: str | None = None


def launcher() -> str:
    """A world-readable copy of the launcher (made once per process, removed at exit)."""
    global _copy
    if _copy is None:
        d = tempfile.mkdtemp(prefix="reasonrl-launcher-")
        os.chmod(d, 0o755)
        atexit.register(shutil.rmtree, d, True)
        path = os.path.join(d, os.path.basename(code._LAUNCHER))
        shutil.copyfile(code._LAUNCHER, path)
        os.chmod(path, 0o644)
        _copy = path
    return _copy
