"""What every settings section checks with: `Checks`, the range checks a section runs on its own
fields, and `fail`, the one way a check says no (a ConfigError `key=value: why`, secrets
redacted). A plug-in's own section (registry.py) subclasses `Checks` as the shared ones do."""

from __future__ import annotations

from reasonrl_fast.errors import ConfigError
from reasonrl_fast.redact import redact_text, redact_value


def fail(key: str, value, what: str):
    """A ConfigError `key=value: what`, the value shown as a message may show it."""
    try:  # a secret never shown (nor a URL's password in a nested value); a huge value cut
        shown = redact_text(repr(redact_value(key, value)))
    except RecursionError:
        shown = "a value nested too deeply"
    if len(shown) > 200:
        shown = f"{shown[:100]}... ({len(shown)} characters)"
    raise ConfigError(f"{key}={shown}: {what}")


def tristate(value, key: str) -> str:
    """'auto', 'true' or 'false' from the config value of `key` (YAML booleans included)."""
    v = str(value).strip().lower()
    if v not in ("auto", "true", "false"):
        raise ConfigError(f"{key}={value!r}: must be auto, true or false")
    return v


class Checks:
    """Range checks a section runs on its own fields; `at` is the section's dotted name. A
    section (a dataclass, one docstring per field) subclasses it and writes `check(at)`; the
    sections nested in it are checked after it, each with its own `at` (schema.py)."""

    def _one_of(self, at: str, name: str, choices) -> None:
        if getattr(self, name) not in choices:
            fail(f"{at}{name}", getattr(self, name), f"must be one of {tuple(choices)}")

    def _positive(self, at: str, *names: str) -> None:
        for name in names:
            if not getattr(self, name) > 0:
                fail(f"{at}{name}", getattr(self, name), "must be > 0")

    def _not_negative(self, at: str, *names: str) -> None:
        # 0 means "off" (or "keep all") for such counters; a negative value means nothing
        for name in names:
            if getattr(self, name) < 0:
                fail(f"{at}{name}", getattr(self, name), "must be >= 0")

    def _probability(self, at: str, *names: str) -> None:
        for name in names:
            if not 0 <= getattr(self, name) <= 1:
                fail(f"{at}{name}", getattr(self, name), "must be in [0, 1]")

    def _tristate(self, at: str, *names: str) -> None:
        # normalised in place: whoever reads the setting compares with "auto", "true", "false"
        for name in names:
            setattr(self, name, tristate(getattr(self, name), f"{at}{name}"))

    def _between(self, at: str, name: str, lo: float, hi: float, *, lo_open: bool = False,
                 hi_open: bool = False) -> None:
        """lo <= value <= hi, either end open (excluded) as asked; an unset (None) value passes."""
        value = getattr(self, name)
        if value is None:
            return
        if (value <= lo if lo_open else value < lo) or (value >= hi if hi_open else value > hi):
            fail(f"{at}{name}", value, f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}")

    def _duration(self, at: str, *names: str, zero: bool = False) -> None:
        """A wait in seconds: above 0 (or 0 with `zero`) and at most MAX_WAIT_S."""
        for name in names:
            value = getattr(self, name)
            if value is None:
                continue
            if not (0 <= value if zero else 0 < value) or value > MAX_WAIT_S:
                fail(f"{at}{name}", value, f"must be in {'[' if zero else '('}0, {MAX_WAIT_S}] seconds")

    def _seed(self, at: str, name: str) -> None:
        self._between(at, name, 0, SEED_MAX)

    def _named(self, at: str, *names: str) -> None:
        """A path or name that must not be empty (an empty one would mean the working directory)."""
        for name in names:
            if not getattr(self, name).strip():
                fail(f"{at}{name}", getattr(self, name), "must not be empty")

    def _file_list(self, at: str, name: str) -> None:
        for f in getattr(self, name):
            if not f.strip():
                fail(f"{at}{name}", getattr(self, name), "an empty file name")


# The longest wait a timeout or cool-down may ask for: a week. Longer is a typo, not a wish, and
# far below what time.monotonic arithmetic, asyncio and threading (TIMEOUT_MAX ~ 9.2e9 s) or
# torch.distributed's millisecond timeouts hold.
MAX_WAIT_S = 7 * 24 * 3600
# trainer.seed seeds vLLM's engine, which seeds numpy's global generator (np.random.seed takes
# [0, 2**32 - 1]); torch.manual_seed takes that range too. eval.seed shares the rule.
SEED_MAX = 2**32 - 1


_fail, _Checks = fail, Checks  # the names the sections were written with

__all__ = ["Checks", "ConfigError", "MAX_WAIT_S", "SEED_MAX", "fail", "tristate"]
