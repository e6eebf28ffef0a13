"""An algorithm from outside the package with a setting of its own, added as a user adds one: this
module and one registry line, `ALGOS["tempered"] = "tests.algos.plugin_algo:Tempered"`
(tests/algos/test_plugin_algo.py). It is GRPO with every reward scaled by `tempered.scale`."""

from __future__ import annotations

from dataclasses import dataclass

from reasonrl_fast.algos.grpo import GRPO
from reasonrl_fast.config import Checks

PATH = f"{__name__}:Tempered"


@dataclass
class TemperedConfig(Checks):
    scale: float = 1.0
    """What every reward is multiplied by."""
    mode: str = "plain"
    """plain or signed (only the sign of the scaled reward is kept)."""

    def check(self, at: str = "tempered.") -> None:
        self._positive(at, "scale")
        self._one_of(at, "mode", ("plain", "signed"))


class Tempered(GRPO):
    name = "tempered"
    section, Settings = "tempered", TemperedConfig

    def outcome_rewards(self, cfg, scores, acc, flagged):
        r = super().outcome_rewards(cfg, scores, acc, flagged) * cfg.tempered.scale
        return r.sign() if cfg.tempered.mode == "signed" else r
