"""Master weights at a recipe's learning rate (1e-6 in every shipped recipe): two optimizer steps
move nearly every float32 master weight, read from the trainer's own checkpoints. The same run
with bf16 masters changes only a small fraction: an AdamW step of about lr is far below half of
bf16's spacing (8 significant bits) at the weights' magnitudes and rounds away, so a bf16-master
recipe would not learn; the second case also shows that the check tells the two apart."""

import pytest
import torch

from reasonrl_fast.runtime.merge import load_model_tensors

# The embedded default's warm-started model (TINY's barely warm one scores every sample alike, so
# GRPO's advantages and gradients are 0), on one worker, as small as its step allows.
RUN = ["algo=grpo", "optim.lr=1e-6", "optim.warmup_steps=0", "data.prompts_per_step=4", "rollout.n=4",
       "trainer.workers_per_node=1", "data.val_size=4", "trainer.val_every=0", "trainer.steps=3",
       "trainer.save_every=1", "trainer.keep_checkpoints=0"]


def _changed(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return sum(int((a[k] != b[k]).sum()) for k in a) / sum(t.numel() for t in a.values())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_steps_at_lr_1e_6_move_float32_masters_and_round_away_in_bf16(train, tmp_path, dtype):
    out = tmp_path / "run"
    train([*RUN, f"model.dtype={dtype}", f"trainer.output_dir={out}"], tmp_path, timeout=600, tiny=False)
    before, after = (load_model_tensors(str(out / f"checkpoint-{s}")) for s in (2, 3))
    assert {t.dtype for t in after.values()} == {getattr(torch, dtype)}
    changed = _changed(before, after)
    if dtype == "float32":
        assert changed > 0.9, f"{changed:.1%} of float32 master weights changed"
    else:
        assert changed < 0.1, f"{changed:.1%} of bf16 master weights changed"
