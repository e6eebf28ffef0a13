"""The RL learning-rate schedule (trainer/schedule.py) against verl's constant schedule with
warm-up, the lr the worker logs, and the schedule across a checkpoint."""

import json

import pytest
import torch

from reasonrl_fast.runtime import checkpoint as ckpt
from reasonrl_fast.trainer.schedule import advance, make_scheduler, warmup_factor


def verl_lambda(current_step: int, num_warmup_steps: int) -> float:
    # verl/utils/torch_functional.py get_constant_schedule_with_warmup's lr_lambda, written out
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1.0, num_warmup_steps))
    return 1.0


@pytest.mark.parametrize("warmup", [0, 1, 3, 7, 10])
def test_warmup_factor_is_verls(warmup):
    for step in range(3 * warmup + 5):
        assert warmup_factor(step, warmup) == verl_lambda(step, warmup)
    assert warmup_factor(0, warmup) == (0.0 if warmup else 1.0)  # RL step 1 runs at lr 0


def _optimizer(lr):
    w = torch.nn.Parameter(torch.randn(5, 3))
    z = torch.nn.Parameter(torch.randn(4))  # a second group, as the FlowRL Z-head's
    return torch.optim.AdamW([{"params": [w], "lr": lr}, {"params": [z], "lr": lr * 2}], lr=lr,
                             weight_decay=0.1, betas=(0.9, 0.999), fused=True), w


def _rl_steps(opt, sched, w, steps, updates_per_step):
    """RL steps as the worker runs them: several optimizer steps, then `advance`. Returns, per RL
    step, the lrs the optimizer steps ran at and the lr `advance` returned (the logged one)."""
    seen, logged = [], []
    handle = opt.register_step_pre_hook(lambda o, args, kwargs: seen[-1].append(o.param_groups[0]["lr"]))
    for _ in range(steps):
        seen.append([])
        for _ in range(updates_per_step):
            opt.zero_grad()
            (w.square().sum()).backward()
            opt.step()
        logged.append(advance(sched))
    handle.remove()
    return seen, logged


def test_the_logged_lr_is_the_one_the_step_used():
    base, warmup = 1e-3, 4
    opt, w = _optimizer(base)
    sched = make_scheduler(opt, warmup)
    before = w.detach().clone()
    seen, logged = _rl_steps(opt, sched, w, steps=1, updates_per_step=3)
    # RL step 1 at lr 0: Adam's moments took in three gradients, the weights did not move
    assert seen == [[0.0, 0.0, 0.0]] and logged == [0.0]
    assert torch.equal(w.detach(), before)
    state = opt.state[w]
    assert int(state["step"]) == 3 and state["exp_avg"].abs().sum() > 0
    seen2, logged2 = _rl_steps(opt, sched, w, steps=8, updates_per_step=3)
    seen, logged = seen + seen2, logged + logged2
    for k, (used, log) in enumerate(zip(seen, logged), start=1):
        want = base * verl_lambda(k - 1, warmup)
        assert used == [want] * 3 and log == want, k
    assert not torch.equal(w.detach(), before)
    assert opt.param_groups[1]["lr"] == pytest.approx(2 * base)  # the Z-head group keeps its multiple


def test_the_schedule_resumes_from_a_checkpoint(tmp_path):
    """What the worker saves (save_rng: the scheduler as JSON, beside the optimizer's state) and
    loads gives the uninterrupted run's lrs after the resume."""
    base, warmup = 1e-3, 6
    opt, w = _optimizer(base)
    sched = make_scheduler(opt, warmup)
    _, first = _rl_steps(opt, sched, w, steps=3, updates_per_step=2)
    (tmp_path / "trainer_state.json").write_text(json.dumps({"world_size": 1}))
    ckpt.save_rng(str(tmp_path), 0, sched)
    opt_state, w_saved = opt.state_dict(), w.detach().clone()
    _, rest = _rl_steps(opt, sched, w, steps=6, updates_per_step=2)

    opt2, w2 = _optimizer(base)
    with torch.no_grad():
        w2.copy_(w_saved)
    sched2 = make_scheduler(opt2, warmup)
    opt2.load_state_dict(opt_state)
    ckpt.load_rng(str(tmp_path), 0, sched2)
    _, resumed = _rl_steps(opt2, sched2, w2, steps=6, updates_per_step=2)
    assert first + resumed == first + rest
    assert resumed == [base * verl_lambda(k, warmup) for k in range(3, 9)]
