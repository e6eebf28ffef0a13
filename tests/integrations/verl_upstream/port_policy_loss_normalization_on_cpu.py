# Copyright 2024 Bytedance Ltd. and/or its affiliates
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

# Ported from verl v0.9.0 tests/trainer/ppo/test_value_loss_normalization_on_cpu.py (the file
# verl 0.9.1 was released with; commit 483b8a009ba3a97563edee3a19887e4862b8094a). verl 0.9.1 has
# no test of a registered policy loss as such; this file pins the contract its actor loss
# (`ppo_loss`) states for every policy loss and tests for the critic: with the global batch info
# that ppo_loss puts in `config.global_batch_info`, the per-micro-batch losses add up to the
# whole mini-batch's loss whatever the split, the `dp_size` factor recovers the global mean under
# FSDP's gradient averaging, and the SUM-aggregated metric reports the global mean. Ported onto
# the `flowrl` policy loss as verl's registry hands it out, with its extra inputs supplied by
# flowrl_inputs(...) per micro-batch, as the worker does. Assertions are verl's. Not ported:
# the loss_scale_factor test (FlowRL's loss is a mean over sequences, it has no
# seq-mean-token-sum-norm mode) and the clip-fraction test (FlowRL has no clipping statistic).

import pytest
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils.metric import AggregationType, Metric, reduce_metrics
from verl.utils.py_functional import append_to_dict
from verl.workers.config.actor import ActorConfig, PolicyLossConfig

from reasonrl_fast.integrations.verl import flowrl_inputs

# FlowRL ignores loss_agg_mode (its loss is a sequence mean): every mode must give the same.
_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"]

policy_loss_fn = get_policy_loss_fn("flowrl")


def _make_policy_batch(batch_size, resp_len, seed=0, lengths=None):
    g = torch.Generator().manual_seed(seed)
    log_prob = -torch.rand(batch_size, resp_len, generator=g) * 2
    old_log_prob = log_prob + 0.05 * torch.randn(batch_size, resp_len, generator=g)
    ref_log_prob = log_prob + 0.1 * torch.randn(batch_size, resp_len, generator=g)
    log_z = torch.randn(batch_size, generator=g)
    reward = torch.randn(batch_size, generator=g)
    if lengths is None:
        response_mask = torch.ones(batch_size, resp_len)
    else:
        response_mask = torch.zeros(batch_size, resp_len)
        for i, length in enumerate(lengths):
            response_mask[i, :length] = 1.0
    advantages = reward[:, None] * response_mask  # verl broadcasts the outcome advantage
    return log_prob, old_log_prob, ref_log_prob, log_z, advantages, response_mask.bool()


def _config(mode, dp_size=1, batch_num_tokens=None, global_batch_size=None):
    """An actor config as ppo_loss hands it to the policy loss: global_batch_info filled in."""
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=mode,
        policy_loss=PolicyLossConfig(loss_mode="flowrl"),
    )
    config.global_batch_info.update(
        dp_size=dp_size, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size,
        loss_scale_factor=config.loss_scale_factor,
    )
    return config


def _global_kwargs(mask, mode, dp_size=1):
    """The normalization info ``ppo_loss`` forwards for the given mode."""
    return {
        "mode": mode,
        "dp_size": dp_size,
        "batch_num_tokens": int(mask.sum()),
        "global_batch_size": mask.shape[0],
    }


def _loss(batch, lo, hi, **kwargs):
    log_prob, old_log_prob, ref_log_prob, log_z, advantages, mask = batch
    config = _config(**kwargs)
    with flowrl_inputs(log_z=log_z[lo:hi], ref_log_prob=ref_log_prob[lo:hi]):
        return policy_loss_fn(
            old_log_prob=old_log_prob[lo:hi],
            log_prob=log_prob[lo:hi],
            advantages=advantages[lo:hi],
            response_mask=mask[lo:hi],
            loss_agg_mode=config.loss_agg_mode,
            config=config,
            rollout_is_weights=None,
        )


def _accumulate(batch, num_micro_batches, **kwargs):
    """Sum the per-micro-batch policy losses -- what gradient accumulation feeds to the optimizer."""
    batch_size = batch[0].shape[0]
    step = batch_size // num_micro_batches
    return sum(_loss(batch, i, i + step, **kwargs)[0] for i in range(0, batch_size, step))


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("num_micro_batches", [1, 2, 4])
def test_policy_loss_microbatch_invariant_all_modes(mode, num_micro_batches):
    """With the global normalization forwarded, summing the per-micro-batch policy losses equals the
    whole-mini-batch policy loss for every ``loss_agg_mode``, regardless of the micro-batch split."""
    batch_size, resp_len = 8, 10
    assert batch_size % num_micro_batches == 0
    batch = _make_policy_batch(batch_size, resp_len)
    kwargs = _global_kwargs(batch[-1], mode)

    whole, _ = _loss(batch, 0, batch_size, **kwargs)
    accum = _accumulate(batch, num_micro_batches, **kwargs)

    torch.testing.assert_close(accum, whole)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("num_micro_batches", [2, 4])
def test_policy_loss_microbatch_invariant_variable_length(mode, num_micro_batches):
    """Invariance also holds with ragged (variable-length) responses, the realistic case."""
    batch_size, resp_len = 8, 12
    lengths = [12, 7, 3, 11, 5, 9, 2, 6]
    batch = _make_policy_batch(batch_size, resp_len, lengths=lengths)
    kwargs = _global_kwargs(batch[-1], mode)

    whole, _ = _loss(batch, 0, batch_size, **kwargs)
    accum = _accumulate(batch, num_micro_batches, **kwargs)

    torch.testing.assert_close(accum, whole)


@pytest.mark.parametrize("dp_size", [2, 4])
def test_policy_loss_dp_size_matches_global_mean_after_fsdp_reduce(dp_size):
    """The ``dp_size`` multiplier is correct: each rank normalizes by the global batch and
    multiplies by ``dp_size``; FSDP mean-reduces gradients across ranks, recovering the global
    mean. Models that reduction on CPU by splitting the batch into ``dp_size`` shards."""
    batch_size, resp_len = 8, 10
    batch = _make_policy_batch(batch_size, resp_len)
    mask = batch[-1]
    global_tokens = int(mask.sum())

    truth, _ = _loss(batch, 0, batch_size, mode="token-mean", batch_num_tokens=global_tokens)

    rank_step = batch_size // dp_size
    rank_losses = [
        _loss(
            batch, i, i + rank_step, mode="token-mean", dp_size=dp_size, batch_num_tokens=global_tokens,
            global_batch_size=batch_size,
        )[0]
        for i in range(0, batch_size, rank_step)
    ]
    fsdp_reduced = torch.stack(rank_losses).mean()  # FSDP averages gradients across dp ranks

    torch.testing.assert_close(fsdp_reduced, truth)


def test_pg_loss_metric_sum_aggregation_reports_global_mean():
    """The reported ``actor/pg_loss`` metric: ppo_loss aggregates it with SUM when the global
    info is set, so the partial (globally normalized) losses must add up to the global-batch
    mean. Exercises the real append/reduce path ``ppo_loss`` uses."""
    batch_size, resp_len, num_micro_batches = 8, 10, 4
    batch = _make_policy_batch(batch_size, resp_len)
    mask = batch[-1]
    global_tokens = int(mask.sum())

    whole, _ = _loss(batch, 0, batch_size, mode="token-mean", batch_num_tokens=global_tokens)

    aggregated: dict = {}
    step = batch_size // num_micro_batches
    for i in range(0, batch_size, step):
        pg_loss, _ = _loss(
            batch, i, i + step, mode="token-mean", batch_num_tokens=global_tokens, global_batch_size=batch_size
        )
        append_to_dict(aggregated, {"actor/pg_loss": Metric(value=pg_loss, aggregation=AggregationType.SUM)})

    reduced = reduce_metrics(aggregated)
    assert reduced["actor/pg_loss"] == pytest.approx(whole.item(), rel=1e-5)
