"""Master weights at a recipe's learning rate (1e-6 in every shipped recipe), read from the
trainer's own checkpoints over one optimizer step. float32 masters: nearly every weight moves.
bf16 masters with round-to-nearest would keep only a small fraction of the steps (about lr, far
below half of bf16's spacing at the weights' magnitudes), so the config refuses them at this lr
(tests/trainer/test_optim.py); with `optim.bf16_stochastic_round` torchao's AdamW rounds each
new weight up or down at random: few weights move, each by a whole spacing, and the mean move
per weight is float32's (docs/trainer.md, Memory: Precision)."""

import torch

from reasonrl_fast.runtime.merge import load_model_tensors
from tests.helpers.venvs import torchao_pythonpath

# The embedded default's warm-started model (TINY's barely warm one scores every sample alike, so
# GRPO's advantages and gradients are 0), on one worker, as small as its step allows.
RUN = ["algo=grpo", "optim.lr=1e-6", "optim.warmup_steps=0", "data.prompts_per_step=4", "rollout.n=4",
       "trainer.workers_per_node=1", "data.val_size=4", "trainer.val_every=0", "trainer.steps=3",
       "trainer.save_every=1", "trainer.keep_checkpoints=0"]


def _step(train, tmp_path, name: str, settings: list[str], env=None) -> tuple[float, float, set]:
    """(the share of master weights the third step changed, their mean absolute change, dtypes)."""
    out = tmp_path / name
    train([*RUN, *settings, f"trainer.output_dir={out}"], tmp_path, timeout=600, tiny=False, env_extra=env)
    before, after = (load_model_tensors(str(out / f"checkpoint-{s}")) for s in (2, 3))
    assert before.keys() == after.keys()
    n = sum(t.numel() for t in after.values())
    changed = sum(int((before[k] != after[k]).sum()) for k in after) / n
    moved = sum(float((after[k].double() - before[k].double()).abs().sum()) for k in after) / n
    return changed, moved, {t.dtype for t in after.values()}


def test_a_step_at_lr_1e_6_moves_float32_masters_and_bf16_ones_with_stochastic_rounding(train, tmp_path):
    changed, moved, dtypes = _step(train, tmp_path, "float32", ["model.dtype=float32"])
    assert dtypes == {torch.float32}
    assert changed > 0.9, f"{changed:.1%} of float32 master weights changed"
    sr_changed, sr_moved, dtypes = _step(train, tmp_path, "bf16_sr",
                                         ["model.dtype=bfloat16", "optim.bf16_stochastic_round=true"],
                                         env={"PYTHONPATH": torchao_pythonpath()})
    assert dtypes == {torch.bfloat16}
    # a step of ~lr is a small part of a spacing: a weight moves by a spacing with that chance
    assert sr_changed < 0.1, f"{sr_changed:.1%} of bf16 master weights changed"
    # ... so the mean move is float32's in expectation; the two runs' gradients differ (their
    # samples do), hence a factor of 2 either way; round-to-nearest bf16 measured 1/140 of it
    assert 0.5 < sr_moved / moved < 2, (sr_moved, moved)
