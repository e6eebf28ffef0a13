"""What a tool call returns, and how a tool is found and described.

A tool is a function: keyword arguments in (JSON types), text out. Its name is the function's
own; its schema (what a chat template shows the model) is transformers' `get_json_schema` of it,
so its docstring says what it does and what each argument is ("Args:" section), and every
argument has a type hint. Whatever it raises, however long it runs and whatever it prints is the
tool box's to contain (tools/box.py), not the tool's."""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass

from reasonrl_fast.errors import ConfigError
from reasonrl_fast.registry import TOOLS

STATUSES = ("ok", "error", "timeout")


@dataclass
class Observation:
    """What the policy sees of one call: the tool's text ("ok"), or a line saying why there is
    none ("error": it raised, its arguments did not fit, it named no tool, its worker died;
    "timeout": it ran past the time limit), and the call's wall time in seconds."""

    text: str
    status: str = "ok"
    seconds: float = 0.0


def tool_path(spec: str) -> str:
    """The "module:function" of a `rollout.tools` entry: a registered name (registry.py `TOOLS`),
    or a path itself; a ConfigError listing the registered tools for a name that is neither."""
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"rollout.tools: {spec!r} is not a tool name or 'package.module:function'")
    if ":" in spec:
        return spec
    try:
        return TOOLS.path(spec)
    except ValueError as e:
        raise ConfigError(f"rollout.tools: {e}; or name one as 'package.module:function'") from None


def load_tool(spec: str):
    """The function of a `rollout.tools` entry, imported; a ConfigError naming the entry when it
    cannot be imported, is not a function, or has no schema (`tool_schema`)."""
    path = tool_path(spec)
    try:
        fn = pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"rollout.tools: {spec!r} cannot be imported ({type(e).__name__}: {e})") from None
    if not callable(fn) or not hasattr(fn, "__name__"):
        raise ConfigError(f"rollout.tools: {spec!r} is a {type(fn).__name__}, not a function")
    tool_schema(fn, spec)
    return fn


def tool_schema(fn, spec: str = "") -> dict:
    """The OpenAI function schema of tool `fn` ({"type": "function", "function": {"name",
    "description", "parameters"}}), as transformers' `get_json_schema` builds it from the type
    hints and the docstring; a ConfigError naming `spec` (or the function) when it cannot."""
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as e:  # noqa: BLE001 - transformers raises its own TypeErrors and ValueErrors
        raise ConfigError(f"rollout.tools: {spec or fn.__name__!r} has no tool schema ({e}): give every argument "
                          f"a type hint and a docstring with a description and an 'Args:' line for each") from None
    schema.get("function", {}).pop("return", None)  # what chat templates show the model: no return type
    return schema


def first_parameter(schema: dict) -> str | None:
    """The argument a call written as one string fills (the plain form, tools/calls.py): the
    tool's first required argument, or its first; None for a tool without arguments."""
    params = schema["function"].get("parameters", {})
    names = list(params.get("properties", {}))
    required = [n for n in names if n in params.get("required", [])]
    return (required or names or [None])[0]
