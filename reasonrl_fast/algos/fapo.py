"""FAPO: GRPO on +1/-1 rewards in which a right answer that the GenRM flags as reached through a
flawed step is lowered (docs/math.md §FAPO rewards)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reasonrl_fast.algos.grpo import GRPO
from reasonrl_fast.config.checks import Checks, fail
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.protocol import TEMPLATES, normalize_address
from reasonrl_fast.redact import redact_url
from reasonrl_fast.registry import BACKENDS

if TYPE_CHECKING:
    import torch


def fapo_rewards(acc: list[bool], flagged: list[bool], penalty: float) -> torch.Tensor:
    """+1 right, -1 wrong, and 1 - penalty for a right answer the GenRM flags as flawed (0 with
    the default penalty 1)."""
    import torch

    r = [(1.0 - penalty * f) if a else -1.0 for a, f in zip(acc, flagged, strict=True)]
    return torch.tensor(r, dtype=torch.float32)


@dataclass
class GenRMConfig(Checks):
    """The GenRM service FAPO asks (an OpenAI-compatible chat endpoint, docs/fapo.md): `fapo.genrm.*`.
    A GenRM backend's own settings hang here too, as `fapo.genrm.SECTION.*` (registry.py)."""

    addresses: list[str] = field(default_factory=list)
    """Replicas' base URLs (`http://host:port/v1`; a bare `host:port` works). Empty: start our
    server with the `serve` backend on a free loopback port for the run."""
    serve: str = "rule:addition"
    """Backend of the server started when `addresses` is empty (rule:addition or hf:PATH)."""
    model: str = ""
    """Served model name; empty: the first one the server's /v1/models lists."""
    api_key: str = ""
    """Bearer key; empty: $REASONRL_FAST_GENRM_API_KEY (if set). Never written or shown: the run's
    config.yaml holds `<redacted>` in its place (redact.py)."""
    template: str = "auto"
    """Prompt rendering, and with it how the answer is read: fapo (our full instruction, for real
    models), compact (the embedded model's short form), published (the published FAPO run's
    prompt with the raw response, for FAPO-GenRM-4B; any boxed integer but -1 flags, as there),
    auto (compact on the embedded task, else fapo). fapo and compact take an index in range."""
    timeout_s: float = 30.0
    """Time limit of one request attempt. A verdict takes about max_tokens / decode speed: 16384
    tokens at ~60 tokens/s per sequence is ~270 s, so give it 300 s or more; a server decoding
    many requests at once gives each fewer tokens per second."""
    max_retries: int = 3
    """Extra attempts after a failed one (exponential backoff with jitter, another replica first)."""
    max_tokens: int = 1024
    """Longest verdict the GenRM may write."""
    temperature: float = 0.0
    """GenRM sampling temperature (0: greedy). The published FAPO run samples (it sends none, so
    the server's default applies); greedy decoding makes some models loop until max_tokens."""
    top_p: float = 1.0
    """GenRM nucleus sampling, in (0, 1], sent with each request (1: off)."""
    max_concurrency: int = 64
    """Requests in flight at once, over all replicas."""
    cooldown_s: float = 10.0
    """A replica that fails 3 times in a row is skipped this long, then tried again."""
    max_reply_bytes: int = 4 << 20
    """Largest reply body read from a replica; a longer one is a failed, retried attempt."""
    warn_failure_rate: float = 0.5
    """A step whose share of requests left without a verdict passes this gets a console warning
    (those responses get no FAPO penalty: the step is plain GRPO for them); 1 turns it off."""

    def check(self, at: str = "fapo.genrm.") -> None:
        self._one_of(at, "template", ("auto", *TEMPLATES))
        self._positive(at, "max_tokens", "max_concurrency")
        self._duration(at, "timeout_s")
        self._duration(at, "cooldown_s", zero=True)
        if not 0 < self.top_p <= 1:
            fail(f"{at}top_p", self.top_p, "must be in (0, 1]")
        self._not_negative(at, "max_retries", "temperature")
        self._probability(at, "warn_failure_rate")
        self._positive(at, "max_reply_bytes")
        if self.api_key and not re.fullmatch(r"[!-~]+", self.api_key):  # not echoed: a secret
            raise ConfigError(f"{at}api_key: must be printable ASCII without spaces or line breaks "
                              f"(it is sent in an HTTP header)")
        for a in self.addresses:
            try:
                normalize_address(a)
            except ValueError as e:
                raise ConfigError(f"{at}addresses: {str(e).replace(a, redact_url(a))}") from None
        if self.addresses:
            return
        try:  # the registry alone: no server, no torch
            backend, _ = BACKENDS.of(self.serve)
        except ValueError as e:
            fail(f"{at}serve", self.serve, str(e))
        reads = getattr(backend, "templates", None)  # None: any rendering
        if reads is not None and self.template != "auto" and self.template not in reads:
            raise ConfigError(f"{at}template={self.template} is a rendering that "
                              f"{getattr(backend, 'label', 'the backend')} "
                              f"({at}serve={self.serve}) cannot read (it reads {', '.join(reads)}): give "
                              f"{at}addresses of a served GenRM (or a model backend in {at}serve), or use "
                              f"template {' or '.join(reads)}")

    @property
    def local_model(self) -> str | None:
        """The model directory the run's own GenRM server loads; None when the run asks
        `addresses` or its `serve` backend loads no model (registry.py `local_model`)."""
        return BACKENDS.local_model(self.addresses, self.serve)


@dataclass
class FAPOConfig(Checks):
    """FAPO's settings (`fapo.*`): its penalty and the GenRM it asks."""

    penalty: float = 1.0
    """lambda: a right answer the GenRM flags as flawed gets 1 - penalty (right +1, wrong -1)."""
    genrm: GenRMConfig = field(default_factory=GenRMConfig)

    def check(self, at: str = "fapo.") -> None:
        # a flagged right answer gets 1 - penalty: from +1 (0, no penalty) down to -1 (2, as if
        # wrong); past 2 a flawed answer would score below a wrong one
        self._between(at, "penalty", 0, 2)  # fapo.genrm checks itself (config/sections.py check_sections)


class FAPO(GRPO):
    name = "fapo"
    section, Settings = "fapo", FAPOConfig  # and GRPO's: it is GRPO with other rewards
    uses_genrm = True

    def outcome_rewards(self, cfg, scores, acc, flagged):
        return fapo_rewards(acc, flagged, cfg.fapo.penalty)
