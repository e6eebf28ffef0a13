"""Ulysses sequence parallel in the trainer (trainer.sequence_parallel_size): the settings it
refuses before anything starts; two workers that cut each packed row between them train as one
worker with the whole rows does, step for step."""

import pytest

from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast.layout import resolve
from reasonrl_fast.preflight import preflight
from reasonrl_fast.rollout import get_rollout
from tests.helpers.train import read_metrics


def test_what_sequence_parallel_cannot_cut_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^trainer.sequence_parallel_size=3 does not divide the 2 trainer workers"):
        load_config(None, ["trainer.workers_per_node=2", "trainer.sequence_parallel_size=3"])
    with pytest.raises(ConfigError, match=r"^trainer.sequence_parallel_size=2 cuts packed rows: data.packing=false"):
        load_config(None, ["trainer.workers_per_node=2", "trainer.sequence_parallel_size=2", "data.packing=false"])
    cfg = load_config(None, ["trainer.workers_per_node=4", "trainer.sequence_parallel_size=4"])
    model = {"model_type": "qwen2", "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 100,
             "hidden_size": 48}
    with pytest.raises(ConfigError, match=r"^trainer.sequence_parallel_size=4: the model has 6 attention heads, "
                                          r"which 4 sequence-parallel ranks do not divide$"):
        resolve(cfg, model, "cpu", 4, get_rollout("hf"))
    with pytest.raises(ConfigError, match=r"^trainer.sequence_parallel_size=4 cuts packed rows, and this run's are "
                                          r"not: packing: off \(model_type 'gpt2'"):
        resolve(cfg, {**model, "num_attention_heads": 8, "model_type": "gpt2"}, "cpu", 4, get_rollout("hf"))
    layout = resolve(cfg, {**model, "num_attention_heads": 8}, "cpu", 4, get_rollout("hf"))
    assert layout.sequence_parallel == 4 and layout.packed and layout.one_row
    # the preflight's check before Ray starts: the embedded model's 4 heads at 8 workers
    cfg8 = load_config(None, ["trainer.workers_per_node=8", "trainer.sequence_parallel_size=8"])
    with pytest.raises(ConfigError, match=r"^trainer.sequence_parallel_size=8: the model has 4 attention heads"):
        preflight(cfg8, files=False)


@pytest.mark.parametrize("algo, offload, extra", [("grpo", [], ["model.gradient_checkpointing=true"]),
                                                   ("flowrl", ["none", "params+optimizer"], [])])
def test_two_workers_cutting_rows_train_as_one_worker_with_the_whole_rows(train, tmp_path, algo, offload, extra):
    """One worker against two that cut each of its packed rows between them (the tiny runs'
    settings otherwise, tests/helpers/train.py TINY): the same samples (the seeds are the
    samples', not the workers'), the same mini-batch in one micro-batch, and the Z-head's dropout
    drawn alike (the group seeds as its first rank). GRPO, and FlowRL with its Z-head (log Z
    pooled over prompts cut between the workers): the losses, gradient norms and entropies of 3
    steps are the one worker's (float32, 1e-4 relative: the sums run in another order). GRPO with
    activation checkpointing (the layers recomputed in the backward attend over the row again);
    FlowRL also with trainer.offload (FSDP2 then, its shards, gradients and AdamW step in host memory,
    the gradient norm reduced apart from them): the same numbers."""
    runs = {}
    for workers, sp, off in ((1, 1, "none"), (2, 2, "none"), *((2, 2, o) for o in offload[1:])):
        out = tmp_path / f"sp{sp}-{off}"
        p = train([f"algo={algo}", "trainer.steps=3", "trainer.val_every=0", f"trainer.workers_per_node={workers}",
                   f"trainer.sequence_parallel_size={sp}", f"trainer.offload={off}", f"trainer.output_dir={out}", *extra],
                  tmp_path, timeout=300)
        if off != "none":
            assert f"data parallel: fsdp (trainer.sharding=auto, trainer.offload={off})" in p.stdout + p.stderr
        runs[(sp, off)] = read_metrics(out)
    one = runs.pop((1, "none"))
    for run in runs.values():
        assert [r["step"] for r in run] == [1, 2, 3]
        for a, b in zip(one, run):
            for key in ("train/loss", "train/grad_norm", "entropy/mean", "reward/mean"):
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key, a[key], b[key])
