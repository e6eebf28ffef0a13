"""Tools the policy calls mid-answer (multi-turn rollouts): each a plain Python function with type
hints and a docstring in the Google style, from which its OpenAI function schema is built
(transformers' `get_json_schema`, as Hugging Face chat templates and TRL read tools), and one line
in the registry (registry.py `TOOLS`): `TOOLS["name"] = "package.module:function"`, or named as
"package.module:function" in `rollout.tools`.

- tools/base.py: what a call returns (`Observation`), a tool's lookup and schema.
- tools/box.py: `ToolBox`, the run's tools called in worker processes with a time limit that
  really ends them, an output cap, and the failures counted (never raised).
- tools/calls.py: how a call is written in a response and its observation rendered: the plain
  form `<NAME>ARGUMENT</NAME>` (models without a chat template), the `<tool_call>` JSON of
  Qwen2.5/Qwen3 (Hermes) templates, and fenced code for the code interpreter.
- The built-in tools: `calculator` (tools/calculator.py) and `python` (tools/python.py, a code
  interpreter in the code reward's sandbox)."""

from reasonrl_fast.registry import TOOLS
from reasonrl_fast.tools.base import Observation, load_tool, tool_path, tool_schema

__all__ = ["TOOLS", "Observation", "load_tool", "tool_path", "tool_schema"]
