"""The one supervised loop (trainer/sft.py `train`) that the embedded warm start and the
rehearsal's stand-in warm start both run: its loss is the RL update's `Actor` log-probs, and its
parameters (rate schedule, the parameters it trains, clipping, threads) do what they say."""

import os

import torch

from reasonrl_fast.config import load_config
from reasonrl_fast.models.tiny import char_tokenizer, tiny_model
from reasonrl_fast.trainer.policy import Actor, make_batch
from reasonrl_fast.trainer.sft import one_thread, train

SMALL = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2", "model.num_heads=2"]


def _model_and_batch():
    torch.manual_seed(0)
    tok = char_tokenizer()
    model = tiny_model(load_config(None, SMALL).model, len(tok), tok)
    pairs = [("1+2=", "3"), ("20+22=", "42"), ("5+5=", "10")]
    batch = make_batch([tok(p)["input_ids"] for p, _ in pairs],
                       [tok(r)["input_ids"] + [tok.eos_token_id] for _, r in pairs], tok.pad_token_id, "cpu")
    return model, batch


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_loss_is_the_actors_mean_response_logprob():
    model, batch = _model_and_batch()
    with torch.no_grad():
        lp, _, _ = Actor(model)(batch)
    expected = -(lp.sum() / batch["response_mask"].sum()).item()
    assert train(model, lambda _: batch, 1, 1e-3) == expected  # the first step's loss, before it moves
    assert not model.training


def test_it_learns_a_batch_and_only_the_parameters_it_is_given():
    model, batch = _model_and_batch()
    emb = model.get_input_embeddings().weight
    emb.requires_grad_(False)
    before = _weights(model)
    first = train(model, lambda _: batch, 1, 1e-2, params=[p for p in model.parameters() if p.requires_grad])
    last = train(model, lambda _: batch, 40, 1e-2, params=[p for p in model.parameters() if p.requires_grad])
    assert last < 0.2 * first
    after = _weights(model)
    name = next(k for k, v in model.named_parameters() if v is emb)
    assert torch.equal(before[name], after[name])
    assert not torch.equal(before["lm_head.weight"], after["lm_head.weight"])


def test_a_zero_schedule_moves_nothing():
    model, batch = _model_and_batch()
    before = _weights(model)
    train(model, lambda _: batch, 3, 1e-2, schedule=lambda s: 0.0)
    assert all(torch.equal(v, _weights(model)[k]) for k, v in before.items())


def test_clipping_bounds_the_gradient_norm():
    def last_norm(clip):
        model, batch = _model_and_batch()
        train(model, lambda _: batch, 1, 1e-3, clip=clip)
        return torch.norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))

    assert last_norm(None) > 1e-3
    assert last_norm(1e-3) <= 1e-3 * (1 + 1e-4)


def test_one_thread_restores_the_thread_count():
    threads = torch.get_num_threads()
    try:
        with one_thread():
            assert torch.get_num_threads() == 1
            raise KeyError
    except KeyError:
        pass
    assert torch.get_num_threads() == threads



def test_a_warm_start_another_process_finished_first_is_used(tmp_path, monkeypatch):
    """Two processes building the same warm start at once (the tests' xdist workers share one
    cache): the one that renames second finds the first's complete copy, keeps it and removes
    its own, where its rename onto that full directory fails."""
    from reasonrl_fast.trainer import sft

    cfg = load_config(None, [*SMALL, "sft.steps=0", f"sft.cache_dir={tmp_path}"])
    path = sft.sft_cache_path(cfg)
    rename = os.rename

    def the_other_process_renames_first(src, dst):
        if dst == path:
            os.makedirs(path)
            with open(os.path.join(path, "config.json"), "w") as f:
                f.write('{"the": "other process\'s"}')
        rename(src, dst)

    monkeypatch.setattr(os, "rename", the_other_process_renames_first)
    assert sft.warm_start(cfg, log=lambda _: None) == path
    with open(os.path.join(path, "config.json")) as f:
        assert f.read() == '{"the": "other process\'s"}'
    assert os.listdir(tmp_path) == [os.path.basename(path)]  # its own copy removed
