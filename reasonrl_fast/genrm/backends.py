"""The GenRM server's backends, by name: a backend spec `NAME:ARG` (`rule:addition`, `hf:PATH`)
names one of `BACKENDS` and the argument it is built with.

`BACKENDS` maps a name to the backend class as "module:Class", imported when it is asked for
(as rollout/registry.py does for engines): the hf backend's torch and transformers cost nothing
until a server loads a model, and the config checks, the planner and the preflight ask a
backend's facts on any machine. A test or a plug-in adds one with one line,
`BACKENDS["name"] = "package.module:Class"`.

A backend class carries its facts as class attributes (read without building it):
- `usage`: how a spec of it is written ("hf:PATH"), for errors that list the backends;
- `loads_model`: its ARG is a local model directory that the server loads (the preflight and
  the planner read its config.json, the rehearsal replaces it with a small stand-in);
- `templates`: the request templates (protocol.TEMPLATES) it can read, None for any;
- `label`: how a config error names it ("the rule judge").
and builds with `from_spec(arg, device=..., max_batch=...)`, the server's options that a
backend may use or ignore; a ValueError, FileNotFoundError or ImportError there says why not.
Its instances are protocol.Backend (complete, stats, close, default_name).

`parse_backend` is the one reading of a spec; nothing else slices one or compares a backend's
name."""

from __future__ import annotations

import functools
import importlib

BACKENDS: dict[str, str] = {
    "rule": "reasonrl_fast.genrm.rule_backend:RuleBackend",
    "hf": "reasonrl_fast.genrm.hf_backend:HFBackend",
}


@functools.lru_cache(maxsize=None)
def _load(path: str) -> type:
    module, _, cls = path.partition(":")
    return getattr(importlib.import_module(module), cls)


def _usages() -> str:
    """The known backends as their specs are written ("rule:TASK, hf:PATH")."""
    out = []
    for name, path in BACKENDS.items():
        try:
            out.append(getattr(_load(path), "usage", f"{name}:ARG"))
        except (ImportError, AttributeError):  # a plug-in that cannot load still gets named
            out.append(f"{name}:ARG")
    return ", ".join(out)


def parse_backend(spec: str) -> tuple[str, str]:
    """(name, arg) of a backend spec `NAME:ARG` (split at the first ':', so a path may hold
    more); a one-line ValueError listing the known backends when NAME is not one of them."""
    name, colon, arg = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not colon or name not in BACKENDS:
        raise ValueError(f"unknown GenRM backend {name!r}: expected NAME:ARG, one of {_usages()}")
    return name, arg


def get_backend(name: str) -> type:
    """The backend class called `name` (imported on first use); a ValueError listing the known
    ones otherwise."""
    try:
        path = BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown GenRM backend {name!r}: known backends are {_usages()}") from None
    return _load(path)


def backend_of(spec: str) -> tuple[type, str]:
    """(backend class, arg) of a backend spec."""
    name, arg = parse_backend(spec)
    return get_backend(name), arg


def backend_spec(name: str, arg: str) -> str:
    """The spec naming backend `name` built with `arg` (parse_backend's inverse)."""
    get_backend(name)
    return f"{name}:{arg}"


def local_model(addresses, serve: str) -> str | None:
    """The model directory the run's own GenRM server loads: None when the run asks `addresses`
    (replicas it does not start) or its `serve` backend loads no model (a rule judge)."""
    if addresses:
        return None
    cls, arg = backend_of(serve)
    return arg if getattr(cls, "loads_model", False) else None


def make_backend(spec: str, device: str, max_batch: int):
    """The backend a spec names, built (a protocol.Backend); ValueError, FileNotFoundError or
    ImportError with the reason."""
    cls, arg = backend_of(spec)
    return cls.from_spec(arg, device=device, max_batch=max_batch)


__all__ = ["BACKENDS", "backend_of", "backend_spec", "get_backend", "local_model", "make_backend", "parse_backend"]
