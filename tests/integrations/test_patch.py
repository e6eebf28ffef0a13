"""The patch-and-undo mechanism under the TRL and verl patches, on a fake package in sys.modules
(in-process, milliseconds): replaced by identity in every loaded module, copied by modules
imported later, and put back everywhere by undo."""

import sys
import types

import pytest

from reasonrl_fast.integrations import _patch


def original():
    return "original"


def ours():
    return "ours"


class Engine:
    def forward(self):
        return "original forward"


@pytest.fixture
def fakepkg():
    """fakepkg.core defines `f`; fakepkg.user imported it under another name; `fakepkgx` is
    another package whose name starts alike and must not be touched."""
    names = ("fakepkg", "fakepkg.core", "fakepkg.user", "fakepkgx")
    mods = {name: types.ModuleType(name) for name in names}
    mods["fakepkg.core"].f = original
    mods["fakepkg.core"].Engine = Engine
    mods["fakepkg.user"].log_f = original
    mods["fakepkgx"].f = original
    forward = Engine.forward
    sys.modules.update(mods)
    yield mods
    for name in [*mods, "fakepkg.late"]:
        sys.modules.pop(name, None)
    Engine.forward = forward


def test_replace_and_undo_everywhere_including_modules_imported_while_patched(fakepkg):
    core, user, other = fakepkg["fakepkg.core"], fakepkg["fakepkg.user"], fakepkg["fakepkgx"]
    orig_forward = Engine.forward
    handle = _patch.Handle("fakepkg")
    assert handle.replace(original, ours) == 2  # core.f and user.log_f, not fakepkgx.f
    assert core.f is ours and user.log_f is ours and other.f is original
    handle.set_attr(Engine, "forward", lambda self: "our forward")
    assert Engine().forward() == "our forward"

    late = types.ModuleType("fakepkg.late")  # imported while patched: copies the replacement
    late.f = core.f
    sys.modules["fakepkg.late"] = late

    handle.undo()
    assert core.f is original and user.log_f is original and late.f is original
    assert other.f is original and Engine.forward is orig_forward and not handle.active
    core.f = ours  # a second undo does nothing (it does not rebind again)
    handle.undo()
    assert core.f is ours


def test_a_with_block_undoes_at_its_end_also_on_error(fakepkg):
    core = fakepkg["fakepkg.core"]
    with pytest.raises(KeyError):
        with _patch.Handle("fakepkg") as handle:
            handle.replace(original, ours)
            assert core.f is ours
            raise KeyError("boom")
    assert core.f is original and not handle.active


def test_undo_leaves_an_attribute_someone_else_set_since(fakepkg):
    orig_forward = Engine.forward
    handle = _patch.Handle("fakepkg")
    handle.set_attr(Engine, "forward", lambda self: "our forward")

    def theirs(self):
        return "their forward"

    Engine.forward = theirs
    handle.undo()
    assert Engine.forward is theirs and orig_forward is not theirs
