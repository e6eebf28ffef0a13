"""A GenRM backend from outside the package, added as a user adds one: this module and one
registry line, `BACKENDS["echo"] = "tests.genrm.plugin_backend:Echo"` (tests/genrm/test_backends.py).
It answers every request with its spec's argument and a verdict box: `\\boxed{-1}` (no flaw). Its
own settings section, `fapo.genrm.echo` (`EchoConfig`), shows a backend's settings joining the
config's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reasonrl_fast.config import Checks
from reasonrl_fast.protocol import Completion, Sampling

PATH = f"{__name__}:Echo"
MODEL_PATH = f"{__name__}:EchoModel"


@dataclass
class EchoConfig(Checks):
    repeat: int = 1
    """How many times the word is said before the verdict."""

    def check(self, at: str = "fapo.genrm.echo.") -> None:
        self._positive(at, "repeat")


class Echo:
    section, Settings = "echo", EchoConfig  # fapo.genrm.echo.*
    usage = "echo:WORD"
    loads_model = False
    templates = ("fapo",)
    label = "the echo judge"

    @classmethod
    def from_spec(cls, arg: str, device: str, max_batch: int) -> "Echo":
        if not arg:
            raise ValueError("echo:WORD needs a word")
        return cls(arg, device, max_batch)

    def __init__(self, word: str, device: str, max_batch: int) -> None:
        self.word, self.device, self.max_batch = word, device, max_batch
        self.default_name = f"echo-{word}"
        self.calls = 0

    async def complete(self, messages: list[dict[str, str]], sampling: Sampling) -> Completion:
        self.calls += 1
        answer = f"{self.word} \\boxed{{-1}}"
        return Completion(answer, "stop", sum(len(m["content"]) for m in messages), len(answer))

    def stats(self) -> dict[str, Any]:
        return {"echo_calls": self.calls}


class EchoModel(Echo):
    """The same, standing for a backend whose argument is a model directory it loads."""

    usage = "echomodel:PATH"
    loads_model = True
    templates = None
