"""The run's settings schema, `Config`: the shared sections (sections.py) and every registered
plug-in's own section (registry.py: an algorithm's at the top, a task's under `data.`, an
engine's under `rollout.`, a GenRM backend's under `fapo.genrm.`).

It is built when it is first asked for, not at import: the plug-ins are resolved by name, as
their registries resolve them, so importing the settings imports no plug-in package. A registry
line added later (a test, a plug-in) makes the next `schema()` a new one, with its section."""

from __future__ import annotations

import dataclasses
import typing

from reasonrl_fast.config.sections import Root, Sections
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.registry import REGISTRIES

_built: dict[str, type] = {}
"""The built classes by name: `Config` and the shared sections a plug-in's section extends
(pickled by reference through this module's `__getattr__`)."""
_built_for: tuple | None = None
"""The registries' versions `_built` was made from."""
_ROOT_PLUGINS_AFTER = "reward"
"""The top-level plug-in sections (the algorithms') follow this shared one, before optim, so a
run's config.yaml lists grpo, flowrl and fapo where it always did."""


def schema() -> type:
    """The `Config` dataclass of the registries as they are now."""
    global _built_for
    key = tuple(r.version for r in REGISTRIES)
    if key != _built_for:
        _built.clear()
        _built["Config"] = _extend(Sections, (), _declared(), "Config")
        _built_for = key
    return _built["Config"]


def _declared() -> dict[tuple[str, ...], dict[str, tuple[type, str]]]:
    """parent path -> {section: (Settings, who declares it)} over every registry."""
    out: dict[tuple[str, ...], dict[str, tuple[type, str]]] = {}
    for reg in REGISTRIES:
        parent = tuple(reg.at.split(".")) if reg.at else ()
        for name, section, settings in reg.sections():
            at = out.setdefault(parent, {})
            owner = f"{reg.kind} {name!r}"
            if section in at and at[section][0] is not settings:  # one section, one owner
                raise ConfigError(f"the {owner} declares settings section "
                                  f"{'.'.join((*parent, section))}, which {at[section][1]} declares too")
            at.setdefault(section, (settings, owner))
    return out


def unloaded(key: str) -> str:
    """The plug-ins that could have declared the unknown setting `key` as their section (their
    sections hang where it does) but could not be imported, in one clause for its error ("" when
    none): a typo in a plug-in's module path would otherwise read as a typo in the user's key."""
    schema()
    at = key.rpartition(".")[0]
    out = [f"the {reg.kind} {name!r} ({reg[name]}) could not be imported ({why})"
           for reg in REGISTRIES if reg.at == at for name, why in reg.unloaded.items() if name in reg]
    return "; ".join(out)


def _extend(cls: type, path: tuple[str, ...], declared: dict, name: str) -> type:
    """`cls` with the sections declared at `path` added and the sections in it that plug-ins
    extend replaced by their extended classes; `cls` itself when nothing changes (but the root)."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    added, replaced = [], {}
    for section, (settings, owner) in declared.get(path, {}).items():
        if section in names:
            raise ConfigError(f"the {owner} declares settings section {'.'.join((*path, section))}, which is "
                              f"a setting already")
        if not dataclasses.is_dataclass(settings):
            raise ConfigError(f"the {owner} declares settings section {'.'.join((*path, section))} with "
                              f"{settings!r}, which is not a dataclass")
        added.append((section, _extended(settings, (*path, section), declared)))
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            extended = _extended(hints[f.name], (*path, f.name), declared)
            if extended is not hints[f.name]:
                replaced[f.name] = extended
    if not added and not replaced and path:
        return cls
    new = [(n, kind, dataclasses.field(default_factory=kind)) for n, kind in [*replaced.items(), *added]]
    if path:  # a subclass: a replaced field keeps its place, an added one comes last
        base = cls
    else:  # the root: the shared sections' fields anew, the plug-ins' spliced in among them
        shared = [next((x for x in new if x[0] == f.name), None) or (f.name, hints[f.name], _copy(f))
                  for f in dataclasses.fields(cls)]
        cut = next(i for i, x in enumerate(shared) if x[0] == _ROOT_PLUGINS_AFTER) + 1
        new, base = shared[:cut] + new[len(replaced):] + shared[cut:], Root
    built = dataclasses.make_dataclass(name, new, bases=(base,))
    built.__module__ = "reasonrl_fast.config" if not path else __name__
    built.__doc__ = cls.__doc__
    _built[name] = built
    return built


def _extended(cls: type, path: tuple[str, ...], declared: dict) -> type:
    """`cls`, extended where a plug-in's section hangs at or below `path`."""
    if any(p[:len(path)] == path for p in declared):
        return _extend(cls, path, declared, "_".join(("Config", *path)))
    return cls


def _copy(f: dataclasses.Field) -> dataclasses.Field:
    """A field of the same default, for another dataclass."""
    return dataclasses.field(default=f.default, default_factory=f.default_factory, metadata=f.metadata)


def __getattr__(name: str):
    """A built class by name (how pickle finds one); no other name builds the schema."""
    if name.startswith("Config_") and name in (schema(), _built)[1]:
        return _built[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["schema", "unloaded"]
