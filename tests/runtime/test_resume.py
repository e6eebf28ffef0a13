"""What a resumed run may change (runtime/resume.py): the comparison of the checkpoint's settings
with the run's, its refusal before anything starts, and the optimizer settings a resume applies
over the ones the checkpoint's states bring back (trainer/worker.py `apply_optim_settings`)."""

import json
import os

import pytest
import torch

from reasonrl_fast.config import load_config
from reasonrl_fast.runtime import checkpoint as ckpt
from reasonrl_fast.runtime import resume
from reasonrl_fast.trainer.schedule import advance, make_scheduler
from reasonrl_fast.trainer.worker import apply_optim_settings
from tests.helpers.ckpt import config, fake_checkpoint


def _settings(*overrides):
    return resume.settings(load_config(None, list(overrides)))


def test_changes_that_may_be_made_are_listed():
    old = _settings("optim.lr=1e-5", "optim.weight_decay=0.0", "trainer.steps=10")
    new = _settings("optim.lr=3e-5", "optim.weight_decay=0.1", "trainer.steps=20")
    assert resume.compare(old, new) == ["optim.lr 1e-05 -> 3e-05", "optim.weight_decay 0 -> 0.1",
                                        "trainer.steps 10 -> 20"]
    assert resume.compare(old, old) == []


@pytest.mark.parametrize("key,old,new", [
    ("algo", "flowrl", "grpo"), ("rollout.n", 8, 4), ("data.task", "addition", "partition"),
    ("model.hidden_size", 128, 64), ("flowrl.zhead_layers", 3, 2), ("trainer.seed", 0, 1),
    ("data.train_files", [], ["x.jsonl"]), ("model.dtype", "auto", "bfloat16"),
])
def test_a_setting_the_checkpoint_needs_is_refused_naming_it(key, old, new):
    saved, now = _settings(), _settings()
    saved[key], now[key] = old, new
    with pytest.raises(resume.SettingChanged) as e:
        resume.compare(saved, now)
    msg = str(e.value)
    assert msg.startswith(f"{key} was {resume.show(old)} in the checkpoint and is {resume.show(new)} now")
    assert "\n" not in msg


def test_a_setting_that_does_not_apply_may_change():
    # the embedded model's sizes mean nothing for a model of its own; the Z-head's, nothing for GRPO
    saved = _settings("model.path=/m", "algo=grpo")
    now = dict(saved, **{"model.hidden_size": 7, "flowrl.zhead_layers": 1})
    assert resume.compare(saved, now) == ["model.hidden_size 128 -> 7", "flowrl.zhead_layers 3 -> 1"]


def test_secrets_are_not_recorded():
    recorded = _settings("fapo.genrm.api_key=sk-123", "fapo.genrm.addresses=[http://u:pw@h:1/v1]",
                         "trainer.ray_address=ray://admin:pw2@head:10001")
    assert "fapo.genrm.api_key" not in recorded and "fapo.genrm.addresses" not in recorded
    assert "sk-123" not in str(recorded) and "pw@" not in str(recorded) and "pw2" not in str(recorded)
    assert recorded["trainer.ray_address"] == "ray://<redacted>@head:10001"
    # another password is no change, and no line shows one
    again = _settings("trainer.ray_address=ray://admin:other@head:10001")
    assert resume.compare(recorded, again) == []


def _with_settings(path, cfg):
    state = ckpt.read_state(path)
    state["config"] = resume.settings(cfg)
    with open(os.path.join(path, ckpt.STATE), "w") as f:
        json.dump(state, f)


def test_prepare_run_refuses_a_changed_algorithm_and_logs_a_changed_lr(tmp_path):
    path = fake_checkpoint(tmp_path, 2, "abc")
    _with_settings(path, config(tmp_path, "algo=flowrl", "optim.lr=1e-5"))
    with pytest.raises(ckpt.CheckpointError, match=r"algo was 'flowrl' in the checkpoint and is 'grpo' now"):
        ckpt.prepare_run(config(tmp_path, "algo=grpo", "optim.lr=1e-5"), warn=lambda m: None)
    said = []
    got, _ = ckpt.prepare_run(config(tmp_path, "algo=flowrl", "optim.lr=3e-5"), warn=said.append)
    assert got == path and said == ["resume: optim.lr 1e-05 -> 3e-05"]


def test_an_older_checkpoint_is_compared_with_its_run_directorys_config(tmp_path):
    from reasonrl_fast.config import to_yaml

    fake_checkpoint(tmp_path, 2, "abc")  # no settings of its own
    (tmp_path / "config.yaml").write_text(to_yaml(config(tmp_path, "rollout.n=8")))
    with pytest.raises(ckpt.CheckpointError, match="rollout.n was 8"):
        ckpt.prepare_run(config(tmp_path, "rollout.n=4"), warn=lambda m: None)
    os.remove(tmp_path / "config.yaml")
    said = []
    ckpt.prepare_run(config(tmp_path, "rollout.n=4"), warn=said.append)
    assert "without comparing its settings" in said[0]


def _opt(lr, weight_decay=0.0, betas=(0.9, 0.99), warmup=2):
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    opt = torch.optim.AdamW([{"params": params[:1], "lr": lr}, {"params": params[1:], "lr": 2 * lr}],
                            lr=lr, weight_decay=weight_decay, betas=betas)
    return opt, make_scheduler(opt, warmup)


def test_a_resume_trains_with_the_runs_optimizer_settings():
    old_opt, old_sched = _opt(1e-5, weight_decay=0.0)
    for _ in range(3):  # past a warm-up of 2: full lr
        old_opt.step()
        advance(old_sched)
    opt, sched = _opt(3e-5, weight_decay=0.1, betas=(0.8, 0.95), warmup=2)
    opt.load_state_dict(old_opt.state_dict())
    sched.load_state_dict(old_sched.state_dict())
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-5)  # what the checkpoint brings back
    o = load_config(None, ["optim.lr=3e-5", "optim.weight_decay=0.1", "optim.betas=[0.8,0.95]"]).optim
    apply_optim_settings(opt, sched, [3e-5, 6e-5], o)
    for g, base in zip(opt.param_groups, [3e-5, 6e-5]):
        assert (g["lr"], g["initial_lr"], g["weight_decay"], g["betas"]) == (pytest.approx(base), base, 0.1, (0.8, 0.95))
    assert advance(sched) == pytest.approx(3e-5) and opt.param_groups[1]["lr"] == pytest.approx(6e-5)


def test_a_resume_inside_the_warm_up_scales_the_new_lr():
    old_opt, old_sched = _opt(1e-5, warmup=4)
    old_opt.step()
    advance(old_sched)  # one RL step done: the next runs at 1/4 of the lr
    opt, sched = _opt(2e-5, warmup=4)
    opt.load_state_dict(old_opt.state_dict())
    sched.load_state_dict(old_sched.state_dict())
    apply_optim_settings(opt, sched, [2e-5, 4e-5], load_config(None, ["optim.lr=2e-5"]).optim)
    used = []
    for _ in range(4):
        opt.step()
        used.append(advance(sched))
    assert used == pytest.approx([0.5e-5, 1e-5, 1.5e-5, 2e-5])
