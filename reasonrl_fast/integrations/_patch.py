"""Replace a library's functions in its loaded modules, and undo it: the mechanism under the TRL
and verl patches.

A library's modules bind the functions they use by `from x import f` when they are imported, so
replacing `f` in its defining module alone misses every module that imported it already. The
patch therefore rebinds, in every loaded module of the package, each attribute that *is* the
original object (found by identity, whatever the module calls it); a module imported later copies
the replacement from the defining module. Undo rebinds the replacements to the originals the same
way, so modules imported while the patch was on get the originals back too.
"""

from __future__ import annotations

import sys
from typing import Any


def loaded_modules(package: str) -> list[Any]:
    """The loaded modules of `package` (the package itself and its submodules)."""
    return [m for n, m in list(sys.modules.items())
            if m is not None and (n == package or n.startswith(package + "."))]


def rebind(package: str, pairs: dict[int, tuple[Any, Any]]) -> int:
    """In every loaded module of `package`, set each attribute that is `old` to `new`
    ({id(old): (old, new)}); returns how many attributes changed."""
    n = 0
    for module in loaded_modules(package):
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            hit = pairs.get(id(value))
            if hit is not None and hit[0] is value:  # the pair holds `old`: its id is not reused
                setattr(module, attr, hit[1])
                n += 1
    return n


class Handle:
    """An applied patch of `package`: `undo()` (or leaving a `with` block) puts every original
    back; a second undo does nothing. `active` is False once undone."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.active = True
        self._rebound: dict[int, tuple[Any, Any]] = {}  # id(ours): (ours, original)
        self._set: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original, ours)

    def replace(self, original: Any, ours: Any) -> int:
        """Bind `ours` wherever a loaded module of the package binds `original`; returns how many
        bindings changed."""
        self._rebound[id(ours)] = (ours, original)
        return rebind(self.package, {id(original): (original, ours)})

    def set_attr(self, owner: Any, name: str, ours: Any) -> None:
        """Set one attribute that no module binds by name (a method of a class)."""
        self._set.append((owner, name, getattr(owner, name), ours))
        setattr(owner, name, ours)

    def undo(self) -> None:
        if not self.active:
            return
        for owner, name, original, ours in reversed(self._set):
            if getattr(owner, name, None) is ours:
                setattr(owner, name, original)
        rebind(self.package, self._rebound)
        self._set.clear()
        self.active = False

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()
