"""Reading the settings: defaults <- a YAML file <- dotted `key=value` overrides, type-checked
against the schema (schema.py) and then validated (validate.py); and writing them back
(`to_yaml`, secrets redacted).

OmegaConf structured configs give us type checking for free: an unknown key or a value of the
wrong type raises an error that names the key (we re-raise it as a short ConfigError). What
OmegaConf would let through or name badly (YAML 1.1's numbers and booleans, a list given by
index, a section given a value) is refused first, as written (`_check_raw`)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import stat
import typing
from typing import TYPE_CHECKING, get_type_hints

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from reasonrl_fast.config.checks import fail
from reasonrl_fast.config.schema import schema, unloaded
from reasonrl_fast.config.validate import validate
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.redact import SECRET_KEYS, redact_settings, redact_text, redact_value

if TYPE_CHECKING:
    from reasonrl_fast.config import Config


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults <- YAML file <- dotted overrides, type-checked against the dataclasses."""
    layers = [_load_yaml(path)] if path else []
    if overrides:
        layers.append(_parse_overrides(overrides))
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(schema()), *layers)
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = redact_text(str(e).splitlines()[0])
        if key in SECRET_KEYS:  # OmegaConf's message may quote the value
            msg = "not a valid value (not shown: a secret)"
        if isinstance(e, ConfigKeyError) and key and (why := unloaded(key)):  # it may be a broken plug-in's
            msg += f"; its section may be a plug-in's that did not load: {why}"
        raise ConfigError(f"config key {key!r}: {msg}" if key else msg) from None
    except RecursionError:  # what _check_raw lets through nests no deeper than a list: a guard only
        raise ConfigError("the settings nest too deeply") from None
    return validate(obj)


# How the settings' YAML (the config file and each override's value) reads a plain scalar. YAML
# 1.1, which PyYAML and OmegaConf follow, reads yes/no/on/off as booleans, 017 as octal 15,
# 0x10, 0b11, 1_000 and 1:30 (sexagesimal, 90) as ints. Here only true/false (any case YAML 1.2
# allows) are booleans, an int is decimal digits without a leading zero, a float is decimal with
# a point or an exponent (1e-4, .5, 3.0) or .inf/.nan (which the finite check refuses); every
# other plain scalar stays a string. A string where a bool, int or float setting is expected is
# then refused by `_check_raw` with the key, unless it is written as such a number ("5" is 5).
_INT_TEXT = r"[-+]?(?:0|[1-9][0-9]*)"
_FLOAT_TEXT = r"[-+]?(?:(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)"
_BOOL_TAG, _INT_TAG, _FLOAT_TAG = (f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float"))


@functools.cache
def _settings_loader():
    """OmegaConf's own YAML loader (duplicate keys refused, alias expansion bounded) with the
    scalar rules above."""
    try:
        from omegaconf._yaml import get_yaml_loader
    except ImportError:  # omegaconf 2.3
        from omegaconf._utils import get_yaml_loader
    base = get_yaml_loader()

    class SettingsLoader(base):
        pass

    SettingsLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_BOOL_TAG, _INT_TAG, _FLOAT_TAG)]
        for first, resolvers in base.yaml_implicit_resolvers.items()}
    SettingsLoader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                         list("tTfF"))
    SettingsLoader.add_implicit_resolver(_INT_TAG, re.compile(f"^{_INT_TEXT}$"), list("-+0123456789"))
    SettingsLoader.add_implicit_resolver(
        _FLOAT_TAG, re.compile(rf"^(?:{_FLOAT_TEXT}|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."))
    return SettingsLoader


def _parse_yaml(text: str, where: str):
    """`text` read by the settings' loader, or a ConfigError starting with `where`. The message
    gives YAML's problem and its place, not the text around it (which may hold a secret)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # an argument's bytes that were not UTF-8, kept as lone surrogates
        raise ConfigError(f"{where}: not UTF-8 text (bytes the command line could not decode)") from None
    try:
        return yaml.load(text, Loader=_settings_loader())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(part for part in (e.context, e.problem) if part)
        raise ConfigError(f"{where}: not valid YAML ({what}{at})") from None
    except yaml.YAMLError as e:  # the reader's: a control character, a NUL, a lone surrogate
        raise ConfigError(f"{where}: not valid YAML ({' '.join(str(e).split())})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None


def _parse_overrides(overrides) -> DictConfig:
    """The dotted `key=value` overrides as one DictConfig, each value read by the settings' loader
    and checked as written (`_check_raw`); a ConfigError naming the override that cannot be."""
    merged = OmegaConf.create()
    for o in overrides:
        _check_override(o)
        key, _, text = o.partition("=")
        where = f"override {_shown_override(o)!r}"
        value = _parse_yaml(text, where)
        nested = value
        for name in reversed(key.split(".")):
            nested = {name: nested}
        _check_raw(nested, schema())
        try:
            OmegaConf.update(merged, key, value, merge=True)
        except (OmegaConfBaseException, ValueError, TypeError, RecursionError) as e:
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"{where}: {first}") from None
    return merged


def _shown_override(override: str) -> str:
    """An override as an error message may show it: a secret's value redacted."""
    key, eq, value = override.partition("=")
    shown = f"{key}{eq}{redact_value(key, value)}" if eq else redact_text(override)
    return shown if len(shown) <= 200 else f"{shown[:100]}... ({len(shown)} characters)"


def _setting_kind(hint) -> tuple[type | None, bool]:
    """(the scalar type, whether a list of it) of a setting's type hint; Optional unwrapped."""
    if typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is list:
        return typing.get_args(hint)[0], True
    return hint, False


def _check_scalar(key: str, value, kind) -> None:
    """One value as written against its setting's scalar type (see `_check_raw`)."""
    if isinstance(value, str) and value.startswith("${"):  # an interpolation: checked once resolved
        return
    if kind is bool and not isinstance(value, bool) and not (
            isinstance(value, str) and value.lower() in ("true", "false")):
        fail(key, value, "must be true or false")
    if isinstance(value, (list, dict)):
        fail(key, value, "must be a single value, not a list or a mapping")
    if kind in (int, float) and not isinstance(value, bool):
        # inf and nan, as Python writes them, go on to the finite check, which names them
        text = _INT_TEXT if kind is int else f"{_INT_TEXT}|{_FLOAT_TEXT}|(?i:[-+]?(?:inf|infinity|nan))"
        if (isinstance(value, str) and not re.fullmatch(text, value.strip())
                or kind is int and isinstance(value, float)):
            what = "a whole number" if kind is int else "a number"
            fail(key, value, f"must be {what} written in decimal digits (017, 0o17, 0x10, 1_000 and 1:30 are "
                              f"not read as numbers{', nor 1e3 or 2.0 as a whole one' if kind is int else ''})")


def _check_raw(raw, cls, at: str = "") -> None:
    """What the merge would let through or name badly, in one file's or one override's settings
    as written, against the dataclass `cls` of their section:
    - a bool setting takes true or false (YAML's, or the words quoted) and nothing else.
      OmegaConf alone reads any number but 0, and "1", as true: a value meant for another key,
      or a count, would switch the setting on without a word (int and float settings already
      refuse a bool);
    - an int or float setting takes a number written in decimal (the loader's rules above):
      OmegaConf alone would read the string "017" as 17 and "1_000" as 1000, and an int setting
      refuses a float here with the key named;
    - a list setting (optim.betas, data.train_files) is given whole, as a list: `optim.betas.0=`
      makes a mapping, which OmegaConf's merge refuses without naming the key;
    - a section (model, trainer, fapo.genrm, ...) is given as a mapping of its settings: a lone
      value in its place (`trainer=5`) is named here, where OmegaConf's merge names no key.
    Unknown keys are left to the merge, which names them."""
    if not isinstance(raw, dict):
        return
    hints = get_type_hints(cls)
    for key, value in raw.items():
        hint = hints.get(key)
        if hint is None:
            continue
        name = f"{at}{key}"
        if dataclasses.is_dataclass(hint):
            if value is not None and not isinstance(value, dict):
                fail(name, value, f"a section, not a value: give its settings ({name}.NAME=VALUE)")
            _check_raw(value, hint, f"{name}.")
            continue
        kind, is_list = _setting_kind(hint)
        if value is None:  # null: the merge says whether the setting may be unset
            continue
        if is_list:
            if isinstance(value, dict):
                fail(name, value, f"a list setting is given whole, such as {name}=[...]")
            if not isinstance(value, list) and not (isinstance(value, str) and value.startswith("${")):
                fail(name, value, f"must be a list, such as {name}=[...]")
            for i, v in enumerate(value if isinstance(value, list) else []):
                if dataclasses.is_dataclass(kind):  # a list of sections (data.val_sets): each a mapping
                    if not isinstance(v, dict):
                        fail(f"{name}[{i}]", v, f"an entry is a mapping of its settings, such as {name}=[{{name: x}}]")
                    known = [f.name for f in dataclasses.fields(kind)]
                    for key_ in v:  # OmegaConf's merge would name the entry's class, not the setting
                        if key_ not in known:
                            fail(f"{name}[{i}].{key_}", v[key_], f"not a setting of an entry; they are {', '.join(known)}")
                    _check_raw(v, kind, f"{name}[{i}].")
                else:
                    _check_scalar(name, v, kind)
        else:
            _check_scalar(name, value, kind)


# A dotted key: names joined by dots (OmegaConf would read `a..b` or `=v` as a key '' of some section)
_OVERRIDE_KEY = re.compile(r"\w+(\.\w+)*", re.ASCII)


def _check_override(override: str) -> None:
    """A ConfigError unless `override` is `dotted.key=value` (the value may be empty: null)."""
    key, eq, _ = override.partition("=")
    if not eq or not _OVERRIDE_KEY.fullmatch(key):
        raise ConfigError(f"override {_shown_override(override)!r}: expected key=value with a dotted key, such as "
                          f"trainer.steps=3")


def _load_yaml(path: str) -> dict:
    """The config file's sections, checked as written (`_check_raw`), or a ConfigError saying why
    the file cannot be one."""
    where = f"config file {path!r}"
    if not os.path.exists(path):
        hint = ("; settings are given as key=value" if not path.endswith((".yaml", ".yml"))
                and "/" not in path else "")
        raise ConfigError(f"{where}: no such file{hint}")
    if os.path.isdir(path):
        raise ConfigError(f"{where} is a directory, not a YAML file")
    try:  # a FIFO or a device would block the read, or never end it: refused before it is opened
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError as e:
        raise ConfigError(f"{where}: cannot be read ({e.strerror})") from None
    if not regular:
        raise ConfigError(f"{where} is not a regular file (a FIFO, socket or device): give a YAML file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"{where}: cannot be read ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not a UTF-8 text file ({e.reason})") from None
    loaded = _parse_yaml(text, where)
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{where}: {_NOT_SECTIONS}, got {type(loaded).__name__}")
    if not loaded:  # an empty or truncated file is more likely a mistake than a wish for the defaults
        raise ConfigError(f"{where} is empty (no settings): give its sections, or leave the file out for "
                          f"the defaults")
    _check_raw(loaded, schema())
    return loaded


_NOT_SECTIONS = "expected a mapping of sections (algo:, model:, data:, ...)"


def to_yaml(cfg: Config) -> str:
    """The settings as YAML, secrets redacted (redact.py): what a run writes to its config.yaml,
    which other users may read. Loading it back refuses the redacted values (`validate`)."""
    return OmegaConf.to_yaml(redact_settings(dataclasses.asdict(cfg)))


def config_hash(*parts) -> str:
    """Stable short hash of dataclasses / plain values (used to key the SFT cache)."""
    blob = json.dumps([dataclasses.asdict(p) if dataclasses.is_dataclass(p) else p for p in parts],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_argv(argv: list[str] | tuple[str, ...]) -> Config:
    """A command's `[config.yaml] key=value ...` arguments (train, eval, plan): the first is the
    YAML file unless it is a setting (it has no `=`), the rest are dotted overrides."""
    path = argv[0] if argv and "=" not in argv[0] else None
    return load_config(path, list(argv[1:] if path else argv))


__all__ = ["config_hash", "load_argv", "load_config", "to_yaml"]
