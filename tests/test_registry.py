"""The one plug-in registry (registry.py): a name -> "module:Class" table whose class is imported on
first lookup, one instance per class path, an unknown name answered with the known ones; and the
sections its plug-ins declare, which the settings schema joins or refuses with the owner named."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from reasonrl_fast.config import Checks, ConfigError, load_config
from reasonrl_fast.registry import ALGOS, TASKS, Registry


@dataclass
class OtherGRPOConfig(Checks):
    clip_low: float = 0.1
    """A clip of another meaning."""


class Clash:  # declares grpo's section with other settings
    section, Settings = "grpo", OtherGRPOConfig


class Shadow:  # declares a section named like one of data's settings
    section, Settings = "digits", OtherGRPOConfig


def test_lookup_imports_once_and_names_the_known():
    reg = Registry("widget", "widgets", {"od": "collections:OrderedDict"})
    assert reg.lookup("od") is reg.lookup("od") and type(reg.lookup("od")).__name__ == "OrderedDict"
    assert reg.load("od").__name__ == "OrderedDict" and dict(reg) == {"od": "collections:OrderedDict"}
    with pytest.raises(ValueError, match=r"^unknown widget 'gear': known widgets are od$"):
        reg.lookup("gear")
    version = reg.version
    reg["gear"] = "collections:Counter"  # the one line
    assert reg.version > version and reg.lookup("gear") == {} and "gear" in reg


def test_a_plugin_that_cannot_import_declares_no_section(monkeypatch):
    monkeypatch.setitem(ALGOS, "ghost", "no_such_package.algo:Ghost")
    assert load_config(None, ["grpo.clip_low=0.3"]).grpo.clip_low == 0.3
    with pytest.raises(ModuleNotFoundError):
        ALGOS.lookup("ghost")


@pytest.mark.parametrize("registry, name, cls, message", [
    (ALGOS, "clash", f"{__name__}:Clash", r"algorithm 'clash' declares settings section grpo, which algorithm "
                                          r"'grpo' declares too"),
    (TASKS, "shadow", f"{__name__}:Shadow", r"task 'shadow' declares settings section data\.digits, which is a "
                                            r"setting already"),
])
def test_a_section_has_one_owner(monkeypatch, registry, name, cls, message):
    monkeypatch.setitem(registry, name, cls)
    with pytest.raises(ConfigError, match=message):
        load_config()
