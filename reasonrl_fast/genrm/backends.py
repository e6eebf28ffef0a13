"""The GenRM server's backends, by name: a backend spec `NAME:ARG` (`rule:addition`, `hf:PATH`)
names one of `BACKENDS` and the argument it is built with.

`BACKENDS` (registry.py, re-exported here) maps a name to the backend class as "module:Class",
imported when it is asked for (as rollout/registry.py does for engines): the hf backend's torch
and transformers cost nothing until a server loads a model, and the config checks, the planner
and the preflight ask a backend's facts on any machine. A test or a plug-in adds one with one line,
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

A backend with settings of its own declares them under `fapo.genrm.` (`section`, `Settings`).

`parse_backend` (registry.py `BackendRegistry.parse`) is the one reading of a spec; nothing else
slices one or compares a backend's name."""

from __future__ import annotations

from reasonrl_fast.registry import BACKENDS

parse_backend = BACKENDS.parse
backend_of = BACKENDS.of
local_model = BACKENDS.local_model


def get_backend(name: str) -> type:
    """The backend class called `name` (imported on first use); a ValueError listing the known
    ones otherwise."""
    return BACKENDS.lookup(name)


def backend_spec(name: str, arg: str) -> str:
    """The spec naming backend `name` built with `arg` (parse_backend's inverse)."""
    get_backend(name)
    return f"{name}:{arg}"


def make_backend(spec: str, device: str, max_batch: int):
    """The backend a spec names, built (a protocol.Backend); ValueError, FileNotFoundError or
    ImportError with the reason."""
    cls, arg = backend_of(spec)
    return cls.from_spec(arg, device=device, max_batch=max_batch)


__all__ = ["BACKENDS", "backend_of", "backend_spec", "get_backend", "local_model", "make_backend", "parse_backend"]
