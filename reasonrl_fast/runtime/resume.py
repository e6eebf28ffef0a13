"""What a resumed run may change of the settings its checkpoint was written with, in one place.

A checkpoint records the settings of the run that wrote it (`settings`, TrainState.config).
Resume compares them with the run's own (`compare`) before any worker starts and before the run
directory's config.yaml is rewritten: a setting in FIXED that differs is refused with one line
naming it, its old and its new value; every other difference is applied as written and logged
("resume: optim.lr 1e-05 -> 3e-05"). The optimizer's settings are the ones the checkpoint's own
state would otherwise bring back (its param groups keep their lr, weight decay and betas, the
scheduler its base lrs): the workers set them from the run's settings after loading
(trainer/worker.py `apply_optim_settings`)."""

from __future__ import annotations

import os
from collections.abc import Callable

import yaml
from omegaconf import OmegaConf

from reasonrl_fast.redact import redact_value
from reasonrl_fast.runtime.checkpoint import CheckpointError, TrainState

# Never written into a checkpoint nor logged: a key, or addresses that may carry credentials
# (user:password@host), does not belong beside the weights. Either may change on resume.
SECRET = frozenset({"fapo.genrm.api_key", "fapo.genrm.addresses"})


def _embedded_model(s: dict) -> bool:
    return not s.get("model.path")


def _embedded_task(s: dict) -> bool:
    return not s.get("data.train_files")


def _always(s: dict) -> bool:
    return True


_SAME_MODEL = "the saved weights are of this model"
_SAME_SHAPE = "the saved weights have the embedded model's shape"
_SAME_WARM = "the embedded model's warm start is the run's starting point and its reference policy"
_SAME_DATA = "the saved data position indexes this training set"

# Settings a resumed run must keep, each with why, and when it matters (on the checkpoint's
# settings: the embedded model's sizes mean nothing when model.path names a model). Everything
# else (the optimizer's lr, weight decay, betas, warm-up and clipping, the step count, logging,
# validation and checkpoint cadence, timeouts, rollout engine, sharding and the worker count,
# which torch.distributed.checkpoint reshards) may change.
FIXED: dict[str, tuple[str, Callable[[dict], bool]]] = {
    "algo": ("the saved model and optimizer state are this algorithm's (FlowRL's Z-head among them)", _always),
    "model.path": (_SAME_MODEL, _always),
    "model.hidden_size": (_SAME_SHAPE, _embedded_model),
    "model.num_layers": (_SAME_SHAPE, _embedded_model),
    "model.num_heads": (_SAME_SHAPE, _embedded_model),
    "model.intermediate_size": (_SAME_SHAPE, _embedded_model),
    "model.dtype": ("the saved weights and AdamW states are held in the master dtype", _always),
    "optim.bf16_stochastic_round": ("the saved AdamW states are those of the optimizer it picks", _always),
    "flowrl.zhead_layers": ("the saved Z-head has this many layers", lambda s: s.get("algo") == "flowrl"),
    "sft.steps": (_SAME_WARM, _embedded_model),
    "sft.batch_size": (_SAME_WARM, _embedded_model),
    "sft.lr": (_SAME_WARM, _embedded_model),
    "data.task": ("the embedded model's tokenizer and training set are built for the problems data.task names",
                  _embedded_task),
    "data.train_files": (_SAME_DATA, _always),
    "data.max_prompt_length": ("it decides which prompts the training set keeps, which the saved data "
                               "position indexes", _always),
    "data.shuffle": ("the saved data position is in this order", _always),
    "data.train_size": (_SAME_DATA, _embedded_task),
    "data.digits": (_SAME_DATA, _embedded_task),
    "data.carry_frac": (_SAME_DATA, _embedded_task),
    "data.carry_slip_prob": (_SAME_DATA, _embedded_task),
    "data.flaw_prob": (_SAME_DATA, _embedded_task),
    "data.partition.styles": (_SAME_DATA, _embedded_task),
    "rollout.n": ("the group size is part of the objective the saved state was trained on", _always),
    "trainer.seed": ("the data order and every sample's seed derive from it", _always),
}


class SettingChanged(ValueError):
    """A FIXED setting differs from the checkpoint's."""


def settings(cfg) -> dict:
    """`cfg`'s settings by dotted key (what a checkpoint records), secrets left out and any other
    URL's user:password redacted (trainer.ray_address may carry them): compared and logged as
    redacted, so a changed password is no change and no log line shows one."""
    return {k: redact_value(k, v) for k, v in flatten(OmegaConf.to_container(OmegaConf.structured(cfg))).items()
            if k not in SECRET}


def flatten(d: dict, at: str = "") -> dict:
    out: dict = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{at}{k}."))
        else:
            out[f"{at}{k}"] = v
    return out


def show(v) -> str:
    return f"{v:g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)


def compare(saved: dict, now: dict) -> list[str]:
    """The changes from the checkpoint's settings `saved` to the run's `now` (both dotted), as
    "KEY OLD -> NEW" lines; SettingChanged for the first FIXED setting that differs. A key only
    one of them has (a setting added or removed since the checkpoint) is no change."""
    for key, (why, applies) in FIXED.items():
        if key in saved and key in now and saved[key] != now[key] and applies(saved):
            raise SettingChanged(f"{key} was {show(saved[key])} in the checkpoint and is {show(now[key])} now, "
                                 f"which a resumed run cannot change ({why})")
    return [f"{k} {show(saved[k])} -> {show(now[k])}" for k in now
            if k in saved and k not in SECRET and saved[k] != now[k]]


def saved_settings(path: str, state: TrainState) -> tuple[dict | None, str]:
    """The settings the checkpoint `path` was written with, and where they were read: its
    TrainState's `config`, else (a checkpoint written before it recorded them) the config.yaml
    its run directory holds; (None, why) when there is neither."""
    if state.config is not None:
        return state.config, "the checkpoint"
    run_yaml = os.path.join(os.path.dirname(os.path.normpath(path)), "config.yaml")
    try:
        with open(run_yaml) as f:
            loaded = yaml.safe_load(f.read(1 << 20))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None, f"neither the checkpoint nor {run_yaml} records them"
    if not isinstance(loaded, dict):
        return None, f"{run_yaml} is no config"
    return flatten(loaded), run_yaml


def check_resume(path: str, state: TrainState, cfg, log=print) -> list[str]:
    """Resume from `path` (its checked TrainState `state`) under `cfg`: a CheckpointError naming a
    FIXED setting that changed; else each change logged and returned."""
    saved, where = saved_settings(path, state)
    if saved is None:
        log(f"warning: resuming {path} without comparing its settings with this run's ({where})")
        return []
    try:
        changes = compare(saved, settings(cfg))
    except SettingChanged as e:
        raise CheckpointError(f"resuming {path}: {e}; keep it, or start a fresh run (another "
                              f"trainer.output_dir, or trainer.overwrite=true)") from None
    for line in changes:
        log(f"resume: {line}")
    return changes
