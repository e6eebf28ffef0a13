"""The run's settings, for the trainer and the eval command alike: one dataclass per section, each
with its own range checks (`check`), loaded from YAML and dotted `key=value` overrides, then one
cross-section `validate`.

The house's foot: config imports only the ground floor (errors, redact, protocol, util and the
plug-in tables of registry.py), never a plug-in package. The shared sections are in sections.py;
an algorithm, a task, an engine or a GenRM backend declares its own section beside its code, and
schema.py joins them into `Config` when the settings are first read, resolving the plug-ins by
name as the registries do. Loading the settings imports neither torch nor the compiled
extension, so a config error is reported (and `python -m reasonrl_fast.plan` runs) where they are
not installed.

    checks.py    Checks, fail: the range checks every section uses
    sections.py  the shared sections (model, sft, data, rollout, reward, optim, trainer, eval)
    schema.py    Config: the shared sections and the plug-ins' own
    validate.py  the rules that tie sections together
    load.py      YAML and overrides in, YAML out
"""

from __future__ import annotations

from reasonrl_fast.config.checks import MAX_WAIT_S, SEED_MAX, Checks, _Checks, _fail, fail, tristate  # noqa: F401
from reasonrl_fast.config.load import config_hash, load_argv, load_config, to_yaml
from reasonrl_fast.config.schema import schema
from reasonrl_fast.config.sections import (SANDBOX_SHARE, DataConfig, EvalConfig, ModelConfig, OptimConfig,
                                           RewardConfig, RolloutConfig, Sections, SFTConfig, TrainerConfig,
                                           check_sections)
from reasonrl_fast.config.validate import BF16_MIN_LR, check_bf16_lr, check_tensor_parallel, validate
from reasonrl_fast.errors import ConfigError


def __getattr__(name: str):
    """`Config`, the schema of the registries as they are now (schema.py), built on first use."""
    if name == "Config":
        return schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BF16_MIN_LR", "MAX_WAIT_S", "SANDBOX_SHARE", "SEED_MAX", "Checks", "Config", "ConfigError", "DataConfig",
           "EvalConfig", "ModelConfig", "OptimConfig", "RewardConfig", "RolloutConfig", "SFTConfig", "Sections",
           "TrainerConfig", "check_bf16_lr", "check_sections", "check_tensor_parallel", "config_hash", "fail",
           "load_argv", "load_config", "schema", "tristate", "to_yaml", "validate"]
