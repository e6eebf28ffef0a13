"""The run's settings, for the trainer and the eval command alike: one dataclass per section, each
with its own range checks (`check`), loaded from YAML and dotted `key=value` overrides, then one
cross-section `validate`.

OmegaConf structured configs give us type checking for free: an unknown key or a value of the
wrong type raises an error that names the key (we re-raise it as a short ConfigError). The
choices of `algo` and `data.task` are the keys of the ALGOS and TASKS registries, whose entries
are imported only when asked for: loading the settings imports neither torch nor the compiled
extension, so a config error is reported (and `python -m reasonrl_fast.plan` runs) where they
are not installed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import stat
import typing
from dataclasses import dataclass, field
from typing import Optional, get_type_hints

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from reasonrl_fast.algos import ALGOS, get_algo
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.layout import mini_batch_count
from reasonrl_fast.protocol import API_KEY_ENV, TEMPLATES, normalize_address
from reasonrl_fast.redact import (REDACTED, SECRET_KEYS, holds_redacted, redact_settings, redact_text, redact_url,
                                  redact_value)
from reasonrl_fast.rewards.score import SANDBOX_SHARE, check_sandbox
from reasonrl_fast.rollout.registry import ROLLOUTS
from reasonrl_fast.tasks import TASKS, get_task

__all__ = ["Config", "ConfigError", "load_config", "validate", "to_yaml", "config_hash"]


# ---------------------------------------------------------------- checks shared by the sections


def _fail(key: str, value, what: str):
    try:  # a secret never shown (nor a URL's password in a nested value); a huge value cut
        shown = redact_text(repr(redact_value(key, value)))
    except RecursionError:
        shown = "a value nested too deeply"
    if len(shown) > 200:
        shown = f"{shown[:100]}... ({len(shown)} characters)"
    raise ConfigError(f"{key}={shown}: {what}")


def tristate(value, key: str) -> str:
    """'auto', 'true' or 'false' from the config value of `key` (YAML booleans included)."""
    v = str(value).strip().lower()
    if v not in ("auto", "true", "false"):
        raise ConfigError(f"{key}={value!r}: must be auto, true or false")
    return v


class _Checks:
    """Range checks a section runs on its own fields; `at` is the section's dotted name."""

    def _one_of(self, at: str, name: str, choices) -> None:
        if getattr(self, name) not in choices:
            _fail(f"{at}{name}", getattr(self, name), f"must be one of {tuple(choices)}")

    def _positive(self, at: str, *names: str) -> None:
        for name in names:
            if not getattr(self, name) > 0:
                _fail(f"{at}{name}", getattr(self, name), "must be > 0")

    def _not_negative(self, at: str, *names: str) -> None:
        # 0 means "off" (or "keep all") for such counters; a negative value means nothing
        for name in names:
            if getattr(self, name) < 0:
                _fail(f"{at}{name}", getattr(self, name), "must be >= 0")

    def _probability(self, at: str, *names: str) -> None:
        for name in names:
            if not 0 <= getattr(self, name) <= 1:
                _fail(f"{at}{name}", getattr(self, name), "must be in [0, 1]")

    def _tristate(self, at: str, *names: str) -> None:
        # normalised in place: whoever reads the setting compares with "auto", "true", "false"
        for name in names:
            setattr(self, name, tristate(getattr(self, name), f"{at}{name}"))

    def _between(self, at: str, name: str, lo: float, hi: float, *, lo_open: bool = False,
                 hi_open: bool = False) -> None:
        """lo <= value <= hi, either end open (excluded) as asked; an unset (None) value passes."""
        value = getattr(self, name)
        if value is None:
            return
        if (value <= lo if lo_open else value < lo) or (value >= hi if hi_open else value > hi):
            _fail(f"{at}{name}", value, f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}")

    def _duration(self, at: str, *names: str, zero: bool = False) -> None:
        """A wait in seconds: above 0 (or 0 with `zero`) and at most MAX_WAIT_S."""
        for name in names:
            value = getattr(self, name)
            if value is None:
                continue
            if not (0 <= value if zero else 0 < value) or value > MAX_WAIT_S:
                _fail(f"{at}{name}", value, f"must be in {'[' if zero else '('}0, {MAX_WAIT_S}] seconds")

    def _seed(self, at: str, name: str) -> None:
        self._between(at, name, 0, SEED_MAX)

    def _named(self, at: str, *names: str) -> None:
        """A path or name that must not be empty (an empty one would mean the working directory)."""
        for name in names:
            if not getattr(self, name).strip():
                _fail(f"{at}{name}", getattr(self, name), "must not be empty")

    def _file_list(self, at: str, name: str) -> None:
        for f in getattr(self, name):
            if not f.strip():
                _fail(f"{at}{name}", getattr(self, name), "an empty file name")


# The longest wait a timeout or cool-down may ask for: a week. Longer is a typo, not a wish, and
# far below what time.monotonic arithmetic, asyncio and threading (TIMEOUT_MAX ~ 9.2e9 s) or
# torch.distributed's millisecond timeouts hold.
MAX_WAIT_S = 7 * 24 * 3600
# trainer.seed seeds vLLM's engine, which seeds numpy's global generator (np.random.seed takes
# [0, 2**32 - 1]); torch.manual_seed takes that range too. eval.seed shares the rule.
SEED_MAX = 2**32 - 1



@dataclass
class ModelConfig(_Checks):
    path: str = ""
    """Local Hugging Face causal-LM directory. Empty: the embedded tiny Qwen2 model with a
    character-level tokenizer, warm-started by the supervised stage (see `sft`)."""
    hidden_size: int = 128
    """Tiny model only: hidden size."""
    num_layers: int = 2
    """Tiny model only: decoder layers."""
    num_heads: int = 4
    """Tiny model only: attention heads (key/value heads = heads / 2)."""
    intermediate_size: int = 512
    """Tiny model only: MLP width."""
    max_position_embeddings: Optional[int] = None
    """The model's context: the longest sequence (prompt + response) the run gives it, which
    data.max_prompt_length + rollout.max_new_tokens must not exceed (checked before anything
    starts). Unset: config.json's max_position_embeddings (256 for the embedded tiny model, which
    is built with this value). Set: it replaces config.json's in every model the run loads, the
    trainer's workers, the reference model, the vLLM engines (`hf_overrides`) and the eval
    command, and in the checkpoints' config.json; RoPE's θ and scaling stay as they are. Raising
    it past the length a model was trained at is what the published Qwen2.5-Math RL recipes do
    (Qwen2.5-Math-7B ships 4096, θ 10000; verl's and FAPO's scripts run it at 32768): set it when
    the prompt and response need more than config.json says, and check the model's outputs at
    those lengths."""
    dtype: str = "auto"
    """Parameter dtype of the master weights: auto (float32), float32 or bfloat16. On GPU the
    forward/backward runs in bf16 via FSDP2 mixed precision either way. bfloat16 halves the
    weights' and AdamW states' memory but cannot hold an update much below its spacing: it is
    refused at an optim.lr below `BF16_MIN_LR` (~3e-5) unless optim.bf16_stochastic_round is
    on (docs/trainer.md, Memory: Precision)."""
    compute_dtype: str = "auto"
    """The dtype the trainer's forward and backward run in (attention, the frozen reference and
    the sampler's copy follow it): auto (bf16 under FSDP2 on a GPU, else the master dtype),
    bfloat16 (FSDP2's bf16 mixed-precision policy on any device: bf16 compute, float32 gradient
    reduction; over float32 masters it needs trainer.sharding=fsdp; the rehearsal uses it on CPU
    to run a GPU's numerics) or float32 (float32 masters only)."""
    fused_lm_head: str = "auto"
    """Log-probs and entropies straight from the final hidden states and the LM-head weight
    (`linear_token_logprob`), never forming the [tokens, vocabulary] logits: true, false, or
    auto (on GPU always; on CPU when one forward's response tokens x vocabulary is large enough
    to gain, see docs/trainer.md). A head that is not a plain linear layer (a bias, soft-capped
    or scaled logits) keeps the unfused path; with true that is an error."""
    gradient_checkpointing: bool = False
    """Activation checkpointing: keep only each decoder layer's input in the update's forward and
    recompute the layer in the backward (non-reentrant, one checkpoint per layer). Activation
    memory drops from all of a layer's intermediates to one hidden state per token and layer,
    for about one more forward of compute."""

    def check(self, at: str = "model.") -> None:
        self._one_of(at, "dtype", ("auto", "float32", "bfloat16"))
        self._one_of(at, "compute_dtype", ("auto", "float32", "bfloat16"))
        # the embedded model's sizes: transformers' own config check would stop a count below 1
        # with a message that names none of them
        self._positive(at, "hidden_size", "num_layers", "num_heads", "intermediate_size")
        self._tristate(at, "fused_lm_head")
        if self.max_position_embeddings is not None:
            self._positive(at, "max_position_embeddings")


@dataclass
class SFTConfig(_Checks):
    """Supervised warm start of the embedded tiny model (cached, keyed by the config)."""

    steps: int = 300
    """Optimiser steps of the supervised stage (0: no warm start)."""
    batch_size: int = 64
    """Examples per supervised step."""
    lr: float = 3e-3
    """Learning rate of the supervised stage (AdamW, cosine decay)."""
    cache_dir: str = "~/.cache/reasonrl_fast/sft"
    """Where the warm-started model is cached; the folder name is a hash of everything that
    shapes it (model, task, sft, seed), so a changed config never reuses a stale cache."""

    def check(self, at: str = "sft.") -> None:
        self._not_negative(at, "steps")
        self._positive(at, "batch_size", "lr")
        self._named(at, "cache_dir")


@dataclass
class DataConfig(_Checks):
    train_files: list[str] = field(default_factory=list)
    """jsonl/parquet files with fields `prompt` and `answer`. Empty: the built-in synthetic task."""
    val_files: list[str] = field(default_factory=list)
    """Validation files (same format). Empty: a held-out split of the synthetic task."""
    train_sources: list[str] = field(default_factory=list)
    """The data_source the records of each file of `train_files` carry, in order, as data.prepare
    writes them (math_dapo, math_dapo_boxed, aime24, genrm, ...). The trainer reads each record's
    own; the CPU rehearsal (reasonrl_fast.rehearse) gives its stand-in records these where a file
    is not on its machine, and checks them against one that is."""
    val_sources: list[str] = field(default_factory=list)
    """The same as `train_sources`, for `val_files`."""
    prompts_per_step: int = 16
    """Prompts per RL step (each sampled `rollout.n` times)."""
    max_prompt_length: int = 16
    """Prompts longer than this (in tokens) are dropped at load time, with a warning."""
    val_size: int = 256
    """Synthetic task: number of validation prompts."""
    train_size: int = 100000
    """Synthetic task: number of training prompts."""
    digits: int = 2
    """Synthetic task: digits per operand of the addition."""
    carry_frac: float = 0.75
    """Synthetic task: fraction of problems whose sum needs a carry between columns."""
    carry_slip_prob: float = 0.5
    """Synthetic task: probability that a supervised demonstration forgets one carry
    (noisy demonstrations leave room for RL to improve on the warm start)."""
    flaw_prob: float = 0.4
    """Synthetic task: probability that a demonstration without a slip miswrites a digit of one
    column while its answer stays right (a flawed positive: GRPO rewards it, FAPO should not)."""
    partition_styles: list[float] = field(default_factory=lambda: [0.6, 0.3, 0.1])
    """data.task=partition: how often the warm start's demonstrations split each digit in halves,
    as the first digit less one and the rest, or at random (relative weights; [1, 1, 1]: an even
    mix, a flatter warm start)."""
    shuffle: bool = True
    """Shuffle the training prompts (each epoch, seeded)."""
    task: str = "addition"
    """Built-in task when `train_files` is empty: addition (math answers in \\boxed{}), code
    (short stdin/stdout programming problems, scored in the sandbox), genrm (judge an addition
    solution: the index of its earliest wrong step, or -1, scored by the GenRM reward; its
    solutions come from the addition demonstrations, with carry_slip_prob and flaw_prob) or
    partition (a number of `digits` digits as the sum of two positive numbers: many right answers
    per prompt, held-out validation numbers). The choices are the keys of tasks.TASKS."""
    packing: str = "auto"
    """Packed sequences in the update and the log-prob passes: a micro-batch's sequences are
    concatenated into one row with restarting position ids, so no padded token enters the
    forward (the attention masks are block-diagonal). true, false, or auto: on where the model's
    attention reads packed rows (Llama-family models: Llama, Qwen2, Qwen3, Mistral without a
    sliding window; docs/trainer.md §Memory)."""
    reward_fn: str = ""
    """Reward function `package.module:function` or `path/to/file.py:function`, called as
    `fn(data_source, solution_str, ground_truth, extra_info)` (a two-argument
    `fn(response, answer)` works too) and returning a float or {"score", "acc"}. Empty: routing by
    each record's `data_source` (math answers, DAPO's scorer for math_dapo/aime*, code in the
    sandbox)."""

    def check(self, at: str = "data.") -> None:
        self._one_of(at, "task", TASKS)
        self._tristate(at, "packing")
        self._positive(at, "prompts_per_step", "max_prompt_length", "val_size", "train_size", "digits")
        self._probability(at, "flaw_prob", "carry_slip_prob", "carry_frac")
        self._file_list(at, "train_files")
        self._file_list(at, "val_files")
        for name in ("train_sources", "val_sources"):
            if any(not s.strip() for s in getattr(self, name)):
                _fail(f"{at}{name}", getattr(self, name), "an empty data_source")
        from reasonrl_fast.tasks.partition import STYLES  # torch-free

        w = self.partition_styles  # read by data.task=partition only
        if len(w) != len(STYLES) or any(x < 0 for x in w) or not sum(w) > 0:
            _fail(f"{at}partition_styles", w, f"needs {len(STYLES)} weights ({', '.join(STYLES)}), finite, >= 0, "
                                               f"not all 0")
        if self.reward_fn and ":" not in self.reward_fn:
            _fail(f"{at}reward_fn", self.reward_fn, "expected `module:function` or `path/to/file.py:function`")


@dataclass
class RolloutConfig(_Checks):
    backend: str = "hf"
    """hf (a Hugging Face model sampled with its KV cache: any device, any model) or vllm (one
    colocated vLLM engine per worker, vLLM >= 0.32 on GPU or CPU; docs/trainer.md §vLLM)."""
    tensor_parallel_size: int = 1
    """vllm only: the workers one rollout engine spans, each holding 1/TP of its weights and KV
    cache (vLLM's tensor parallelism, one engine rank in each worker's own process). Groups of TP
    consecutive workers of a node each run one engine over the prompts of all of them: world / TP
    engines sample a step. Must divide trainer.workers_per_node and the model's attention heads
    (docs/scaling.md §Tensor-parallel rollout)."""
    decoder: str = "auto"
    """hf backend only. auto: Llama-family models (Llama, Qwen2, Qwen3, Mistral without a
    sliding window) are sampled by the lean decoder (rollout/lean.py: fused projections, a
    preallocated KV cache), others through the model's forward; model: always the model's
    forward."""
    n: int = 8
    """Responses sampled per prompt (the GRPO/FlowRL group)."""
    max_new_tokens: int = 32
    """Longest response, in tokens."""
    temperature: float = 1.0
    """Sampling temperature (also used for log-probs)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    val_temperature: float = 1.0
    """Temperature for validation samples (accuracy is mean@val_n at this temperature)."""
    val_top_p: Optional[float] = None
    """Nucleus sampling threshold for validation samples. Unset: top_p. The published runs
    validate at another top-p than they train at (FAPO: 0.7 against 1.0; FlowRL's Avg@16: 0.95
    at temperature 0.6), so val/accuracy compares with their numbers only when both are set."""
    val_n: int = 1
    """Samples per validation prompt."""
    gpu_memory_utilization: Optional[float] = None
    """vllm on a GPU only: the fraction of the device's memory the engine may take, weights and KV
    cache (vLLM's own option). Unset: 0.5 (the trainer's shard and optimiser share the rest, the
    engine sleeps during the update). Ignored when kv_cache_memory_bytes is set, and on CPU."""
    kv_cache_memory_bytes: Optional[int] = None
    """vllm only: the engine's KV cache in bytes (vLLM's own option). Unset: on CPU, what the
    rollout batch needs at its longest (each worker's prompts x rollout.n sequences of
    data.max_prompt_length + rollout.max_new_tokens tokens; rollout/vllm.py `kv_cache_bytes`,
    which `python -m reasonrl_fast.plan --device cpu` shows); on a GPU, gpu_memory_utilization
    decides. Fewer bytes make vLLM queue the sequences that do not fit; at least one full-length
    sequence must."""
    sync_every: int = 1
    """Load the policy's weights into the rollout engine every this many steps. 1: every sample
    is drawn from the current policy. k > 1 leaves the engine up to k - 1 updates behind (a
    deliberately stale, off-policy rollout; see rollout.correction)."""
    correction: str = "none"
    """Off-policy correction for the gap between the sampler's and the trainer's log-probs
    (docs/math.md §Rollout correction): none, token_tis (a truncated importance weight per
    token) or seq_tis (one per response)."""
    is_cap: float = 2.0
    """The truncation of the rollout importance weights: min(ratio, is_cap)."""

    def check(self, at: str = "rollout.") -> None:
        self._one_of(at, "backend", tuple(ROLLOUTS))  # read when checked: a registered engine counts
        self._one_of(at, "decoder", ("auto", "model"))
        self._one_of(at, "correction", ("none", "token_tis", "seq_tis"))
        self._positive(at, "n", "max_new_tokens", "temperature", "sync_every", "is_cap", "tensor_parallel_size",
                       "val_n")
        self._not_negative(at, "val_temperature")  # 0: greedy validation (rollout/base.py GREEDY_BELOW)
        for name in ("top_p", "val_top_p"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                _fail(f"{at}{name}", value, "must be in (0, 1]")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            _fail(f"{at}gpu_memory_utilization", self.gpu_memory_utilization, "must be in (0, 1]")
        if self.kv_cache_memory_bytes is not None:
            self._positive(at, "kv_cache_memory_bytes")

    def val_sampling(self) -> tuple[float, float]:
        """(temperature, top-p) of validation samples: the one place val_top_p falls back to
        top_p."""
        return self.val_temperature, self.top_p if self.val_top_p is None else self.val_top_p


@dataclass
class RewardConfig(_Checks):
    num_workers: int = 2
    """Reward worker processes (or Ray actors) scoring a step's samples in parallel."""
    timeout_s: float = 30.0
    """Time limit of one sample's scoring: past it the worker is killed and replaced, and the
    sample scores 0 (counted in reward/timeouts)."""
    backend: str = "process"
    """process (worker processes beside the driver) or ray (actors spread over the cluster)."""
    sandbox_timeout_s: Optional[float] = None
    """Time limit of one program's tests in the code sandbox (code records only). Unset: a third
    of timeout_s (10 s for the default 30 s), leaving the rest for starting the sandbox, so that a
    slow program is reported by the sandbox, not killed with its worker. When set, it must be
    below timeout_s, which is checked only where code records are scored in the sandbox."""

    def check(self, at: str = "reward.") -> None:
        self._one_of(at, "backend", ("process", "ray"))
        self._positive(at, "num_workers")
        self._duration(at, "timeout_s")
        if self.sandbox_timeout_s is None:  # derived; checked against the data in `validate`
            self.sandbox_timeout_s = self.timeout_s / SANDBOX_SHARE
        self._duration(at, "sandbox_timeout_s")


@dataclass
class GRPOConfig(_Checks):
    clip_low: float = 0.2
    """epsilon_low of the clipped surrogate."""
    clip_high: float = 0.28
    """epsilon_high (clip-higher, DAPO)."""
    loss_agg: str = "token-mean"
    """token-mean, seq-mean-token-mean or seq-mean-token-sum."""
    kl_coef: float = 0.0
    """Coefficient of the k3 KL to the reference policy (0: no reference model)."""
    overlong_buffer: int = 0
    """DAPO overlong shaping buffer L_buf in tokens (0: off), for algo=grpo and fapo (FlowRL has
    its own, flowrl.overlong_buffer)."""
    overlong_factor: float = 1.0
    """DAPO overlong penalty factor."""
    norm_by_std: bool = True
    """Divide advantages by the group std (False: Dr.GRPO)."""
    clip_ratio_c: Optional[float] = None
    """Dual clip (verl's clip_ratio_c, 10.0 in its FAPO and baseline scripts): a token with a
    negative advantage loses at most -A * clip_ratio_c, so a stale token whose ratio has grown
    past it stops pushing (docs/math.md §GRPO and DAPO policy loss; logged as
    grpo/dual_clip_frac). Unset: off. Must be > 1."""

    def check(self, at: str = "grpo.") -> None:
        self._one_of(at, "loss_agg", ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"))
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            _fail(f"{at}clip_ratio_c", self.clip_ratio_c, "must be > 1 (it bounds ratios above 1)")
        # the clip interval [1 - clip_low, 1 + clip_high] holds ratio 1 whenever both are > 0, and
        # clip_low = 1 already opens it down to 0: positive epsilons cannot invert it, so the two
        # need no order (clip-higher has clip_high > clip_low, the symmetric PPO clip equal ones)
        self._between(at, "clip_low", 0, 1, lo_open=True)
        self._positive(at, "clip_high")
        self._not_negative(at, "kl_coef", "overlong_buffer", "overlong_factor")


@dataclass
class FlowRLConfig(_Checks):
    beta: float = 15.0
    """Reward temperature beta of the trajectory-balance loss."""
    max_is_weight: float = 10.0
    """Cap of the importance weight."""
    is_clip_eps: Optional[float] = None
    """Paper variant: clip the importance weight to [1-eps, 1+eps] instead."""
    zhead_layers: int = 3
    """Layers of the Z-head MLP."""
    zhead_lr_mult: float = 1.0
    """Learning-rate multiplier for the Z-head parameters."""
    overlong_buffer: int = 0
    """DAPO overlong shaping of FlowRL's rewards: buffer L_buf in tokens (0: off; the published
    FlowRL runs shape with 4096, as DAPO)."""
    overlong_factor: float = 1.0
    """DAPO overlong penalty factor of FlowRL's rewards."""

    def check(self, at: str = "flowrl.") -> None:
        # beta scales the advantage in the target pi_ref exp(beta r): 0 ignores the reward, a
        # negative beta trains toward the wrong answers
        self._positive(at, "beta", "max_is_weight", "zhead_layers")
        self._between(at, "is_clip_eps", 0, 1, lo_open=True)  # the weight's clip [1 - eps, 1 + eps]
        self._not_negative(at, "zhead_lr_mult", "overlong_buffer", "overlong_factor")  # 0: a frozen Z-head


@dataclass
class GenRMConfig(_Checks):
    """The GenRM service FAPO asks (an OpenAI-compatible chat endpoint, docs/fapo.md)."""

    addresses: list[str] = field(default_factory=list)
    """Replicas' base URLs (`http://host:port/v1`; a bare `host:port` works). Empty: start our
    server with the `serve` backend on a free loopback port for the run."""
    serve: str = "rule:addition"
    """Backend of the server started when `addresses` is empty (rule:addition or hf:PATH)."""
    model: str = ""
    """Served model name; empty: the first one the server's /v1/models lists."""
    api_key: str = ""
    """Bearer key; empty: $REASONRL_FAST_GENRM_API_KEY (if set). Never written or shown: the run's
    config.yaml holds `<redacted>` in its place (redact.py)."""
    template: str = "auto"
    """Prompt rendering, and with it how the answer is read: fapo (our full instruction, for real
    models), compact (the embedded model's short form), published (the published FAPO run's
    prompt with the raw response, for FAPO-GenRM-4B; any boxed integer but -1 flags, as there),
    auto (compact on the embedded task, else fapo). fapo and compact take an index in range."""
    timeout_s: float = 30.0
    """Time limit of one request attempt. A verdict takes about max_tokens / decode speed: 16384
    tokens at ~60 tokens/s per sequence is ~270 s, so give it 300 s or more; a server decoding
    many requests at once gives each fewer tokens per second."""
    max_retries: int = 3
    """Extra attempts after a failed one (exponential backoff with jitter, another replica first)."""
    max_tokens: int = 1024
    """Longest verdict the GenRM may write."""
    temperature: float = 0.0
    """GenRM sampling temperature (0: greedy). The published FAPO run samples (it sends none, so
    the server's default applies); greedy decoding makes some models loop until max_tokens."""
    top_p: float = 1.0
    """GenRM nucleus sampling, in (0, 1], sent with each request (1: off)."""
    max_concurrency: int = 64
    """Requests in flight at once, over all replicas."""
    cooldown_s: float = 10.0
    """A replica that fails 3 times in a row is skipped this long, then tried again."""
    max_reply_bytes: int = 4 << 20
    """Largest reply body read from a replica; a longer one is a failed, retried attempt."""
    warn_failure_rate: float = 0.5
    """A step whose share of requests left without a verdict passes this gets a console warning
    (those responses get no FAPO penalty: the step is plain GRPO for them); 1 turns it off."""

    def check(self, at: str = "fapo.genrm.") -> None:
        self._one_of(at, "template", ("auto", *TEMPLATES))
        self._positive(at, "max_tokens", "max_concurrency")
        self._duration(at, "timeout_s")
        self._duration(at, "cooldown_s", zero=True)
        if not 0 < self.top_p <= 1:
            _fail(f"{at}top_p", self.top_p, "must be in (0, 1]")
        self._not_negative(at, "max_retries", "temperature")
        self._probability(at, "warn_failure_rate")
        self._positive(at, "max_reply_bytes")
        if self.api_key and not re.fullmatch(r"[!-~]+", self.api_key):  # not echoed: a secret
            raise ConfigError(f"{at}api_key: must be printable ASCII without spaces or line breaks "
                              f"(it is sent in an HTTP header)")
        for a in self.addresses:
            try:
                normalize_address(a)
            except ValueError as e:
                raise ConfigError(f"{at}addresses: {str(e).replace(a, redact_url(a))}") from None
        if self.addresses:
            return
        from reasonrl_fast.genrm.backends import backend_of  # the registry alone: no server, no torch

        try:
            backend, _ = backend_of(self.serve)
        except ValueError as e:
            _fail(f"{at}serve", self.serve, str(e))
        reads = getattr(backend, "templates", None)  # None: any rendering
        if reads is not None and self.template != "auto" and self.template not in reads:
            raise ConfigError(f"{at}template={self.template} is a rendering that "
                              f"{getattr(backend, 'label', 'the backend')} "
                              f"({at}serve={self.serve}) cannot read (it reads {', '.join(reads)}): give "
                              f"{at}addresses of a served GenRM (or a model backend in {at}serve), or use "
                              f"template {' or '.join(reads)}")

    @property
    def local_model(self) -> str | None:
        """The model directory the run's own GenRM server loads; None when the run asks
        `addresses` or its `serve` backend loads no model (genrm/backends.py `local_model`)."""
        from reasonrl_fast.genrm.backends import local_model

        return local_model(self.addresses, self.serve)


@dataclass
class FAPOConfig(_Checks):
    penalty: float = 1.0
    """lambda: a right answer the GenRM flags as flawed gets 1 - penalty (right +1, wrong -1)."""
    genrm: GenRMConfig = field(default_factory=GenRMConfig)

    def check(self, at: str = "fapo.") -> None:
        # a flagged right answer gets 1 - penalty: from +1 (0, no penalty) down to -1 (2, as if
        # wrong); past 2 a flawed answer would score below a wrong one
        self._between(at, "penalty", 0, 2)
        self.genrm.check(f"{at}genrm.")


@dataclass
class OptimConfig(_Checks):
    lr: float = 1e-4
    """Peak learning rate (AdamW)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear warm-up over this many RL steps, then constant: at RL step k (from 1) the lr is
    lr * min((k - 1) / warmup_steps, 1), verl's constant schedule with warm-up (one scheduler
    step per RL step). So the first RL step runs at lr 0: Adam's moments take in its gradients
    but the weights do not move; full lr from step warmup_steps + 1. 0: no warm-up."""
    grad_clip: float = 1.0
    """Gradient-norm clipping; a step with a non-finite norm is skipped and counted."""
    mini_batch_prompts: int = 16
    """Prompts per mini-batch update (all their responses); fewer than prompts_per_step gives
    several updates per step, and then old log-probs are computed before the first."""
    micro_batch_tokens: int = 16384
    """The most tokens one forward of a worker takes (prompt + response, as the forward sees
    them: the real tokens of packed rows, or rows x the longest row when padded). A mini-batch
    with more runs as several micro-batches with gradient accumulation, in the update and in the
    old and reference log-prob passes; the sequences are grouped by length so that the
    micro-batches are balanced, and every worker runs the same number. A sequence longer than
    this runs in a forward of its own (a sequence is never split). 0: each mini-batch in one
    forward. `python -m reasonrl_fast.plan` says what a budget costs in memory."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    """AdamW betas."""
    bf16_stochastic_round: bool = False
    """With model.dtype=bfloat16 only: torchao's AdamW (`torchao.optim._AdamW`, the `bf16`
    extra: pip install ".[bf16]") in place of torch's. It computes the step in float32 and rounds
    the new weight to bf16 stochastically (up with the probability of the remainder), so a step
    below bf16's spacing moves the weight in expectation instead of rounding away; the AdamW
    states stay in bf16. This is what lets bf16 master weights train at an lr below
    `BF16_MIN_LR` (docs/trainer.md, Memory: Precision). Compiled with torch.compile, once per
    parameter shape at the first step (a few seconds each)."""

    def check(self, at: str = "optim.") -> None:
        self._positive(at, "mini_batch_prompts", "grad_clip")
        self._not_negative(at, "micro_batch_tokens", "warmup_steps", "lr", "weight_decay")
        # AdamW's moment decays: beta1 for the gradient, beta2 for its square, each in [0, 1)
        # (torch refuses 1 and more, and a sequence of another length, only at its first step)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            _fail(f"{at}betas", self.betas, "must be two numbers [beta1, beta2], each in [0, 1)")


@dataclass
class TrainerConfig(_Checks):
    steps: int = 150
    """RL steps."""
    output_dir: str = "runs/default"
    """Run directory: config.yaml, metrics.jsonl, TensorBoard events, checkpoint-N/."""
    nnodes: int = 1
    """Ray nodes to place workers on."""
    workers_per_node: int = 2
    """Workers (data-parallel ranks) per node: one GPU each on GPU nodes, one CPU slot each otherwise."""
    cpus_per_worker: int = 1
    """CPU slots per worker (CPU runs; also its torch thread count)."""
    sharding: str = "auto"
    """How the workers hold the policy: fsdp (FSDP2, each decoder layer sharded over the workers),
    replicate (each worker a full copy, gradients averaged with one bucketed all-reduce: DDP), or
    auto: fsdp on GPU, replicate on CPU (where per-layer gathers over gloo cost more than the
    model's compute: docs/trainer.md). One worker holds the model whole unless fsdp is named:
    FSDP2 over one rank then gives bf16 compute over float32 master weights on one GPU."""
    ray_address: str = ""
    """Join this Ray cluster (or $RAY_ADDRESS); empty starts a local instance."""
    save_every: int = 0
    """Checkpoint every N steps (0: only at the end if save_last)."""
    save_last: bool = False
    """Also checkpoint after the last step."""
    keep_checkpoints: int = 2
    """Keep the newest N checkpoints (0: keep all)."""
    val_every: int = 25
    """Validate every N steps (and before the first and after the last); 0: never."""
    resume: str = "auto"
    """auto (newest complete checkpoint in output_dir, if any), never, or a checkpoint path. A
    fresh run (nothing to resume) refuses a directory holding an earlier run's checkpoints."""
    overwrite: bool = False
    """Start a fresh run in output_dir, deleting an earlier run's checkpoints, metrics.jsonl and
    TensorBoard events first (resume is then ignored). For one launch: a restart with it still
    set deletes the checkpoints it would have resumed from."""
    trust_checkpoint: bool = False
    """Load a checkpoint even when other users could have written to it (group- or
    world-writable, owned by another user). Loading a checkpoint can run code: its DCP
    .metadata is a pickle."""
    collective_timeout_s: int = 1800
    """How long a collective waits for the other ranks before failing: long enough for the
    slowest legitimate wait (a 7B FlowRL checkpoint save, ~85 GB of weights and Adam states
    written at ~50 MB/s per node), short enough that a dead or stuck rank ends the run."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    logger: str = "tensorboard"
    """tensorboard, wandb (if installed; TensorBoard is written too), or none."""
    project: str = "reasonrl_fast"
    """wandb project name."""
    progress: bool = True
    """Console progress bar."""

    def check(self, at: str = "trainer.") -> None:
        self._one_of(at, "logger", ("tensorboard", "wandb", "none"))
        self._one_of(at, "sharding", ("auto", "fsdp", "replicate"))
        self._positive(at, "nnodes", "workers_per_node", "cpus_per_worker")
        self._duration(at, "collective_timeout_s")
        self._not_negative(at, "steps", "save_every", "keep_checkpoints", "val_every")
        self._seed(at, "seed")
        self._named(at, "output_dir", "resume")  # resume: auto, never or a checkpoint path


@dataclass
class EvalConfig(_Checks):
    """`python -m reasonrl_fast.eval` (docs/eval.md). The model is `model.path`; the response
    length is `rollout.max_new_tokens`, the engine `rollout.backend`, the prompt length limit
    `data.max_prompt_length`."""

    files: list[str] = field(default_factory=list)
    """jsonl/parquet files (the trainer's record format). Empty: the embedded task's validation
    split, for an embedded-task model only."""
    n: int = 16
    """Samples per prompt (mean@n, maj@n)."""
    k: list[int] = field(default_factory=list)
    """pass@k is reported for each k (each at most n). Empty: 1 and n."""
    temperature: float = 0.6
    """Sampling temperature."""
    top_p: float = 0.95
    """Nucleus sampling threshold."""
    output_dir: str = "runs/eval"
    """Where summary.json and samples.jsonl are written."""
    seed: int = 0
    """Sampling seed (a batch's seed also depends on its position, not on the worker count)."""
    prompts_per_batch: int = 32
    """Prompts per generate call (each sampled n times): bounds a worker's memory."""
    target: str = ""
    """Another eval's output directory (or its samples.jsonl) on the same prompts, such as the
    reference model's: each prompt's distribution over right answers is compared with the one
    there (tv@n, kl@n; docs/eval.md §Distance to a target). Empty: not reported."""

    def check(self, at: str = "eval.") -> None:
        self._positive(at, "n", "temperature", "prompts_per_batch")
        self._seed(at, "seed")
        self._named(at, "output_dir")
        if not 0 < self.top_p <= 1:
            _fail(f"{at}top_p", self.top_p, "must be in (0, 1]")
        for k in self.k:
            if k < 1:
                raise ConfigError(f"{at}k={self.k}: each k must be >= 1")
            if k > self.n:
                raise ConfigError(f"{at}k={self.k}: pass@{k} needs at least {k} samples per prompt, "
                                  f"but {at}n={self.n}")
        self._file_list(at, "files")


@dataclass
class Config(_Checks):
    algo: str = "flowrl"
    """flowrl, grpo, or fapo (GRPO with +1/-1 rewards and flawed positives lowered by a GenRM)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    flowrl: FlowRLConfig = field(default_factory=FlowRLConfig)
    fapo: FAPOConfig = field(default_factory=FAPOConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def embedded_model(self) -> bool:
        """The run's model is the embedded tiny one (model.path empty), warm-started on
        data.task's demonstrations."""
        return not self.model.path

    @property
    def embedded_task(self) -> bool:
        """The run trains on the embedded task data.task (data.train_files empty)."""
        return not self.data.train_files

    def check(self) -> None:
        """Every section's own checks (the cross-section rules are `validate`'s)."""
        self._one_of("", "algo", ALGOS)
        for f in dataclasses.fields(self):  # every section, so a new one cannot be left unchecked
            section = getattr(self, f.name)
            if dataclasses.is_dataclass(section):
                section.check()


def validate(cfg: Config) -> Config:
    """Each section's checks, then the rules that tie sections together."""
    _check_finite(cfg)
    cfg.check()
    _check_not_redacted(cfg, skip=() if get_algo(cfg.algo).uses_genrm else ("fapo.genrm.",))
    world = cfg.trainer.nnodes * cfg.trainer.workers_per_node
    p = cfg.data.prompts_per_step
    n_mb = mini_batch_count(p, cfg.optim.mini_batch_prompts)
    if p // world < n_mb:  # the workers' shares and mini-batches differ by one prompt at most
        raise ConfigError(f"data.prompts_per_step={p} over {world} workers in {n_mb} mini-batches "
                          f"(optim.mini_batch_prompts={cfg.optim.mini_batch_prompts}) leaves a worker a "
                          f"mini-batch without prompts: each needs at least one prompt per mini-batch")
    check_bf16_lr(cfg)
    check_tensor_parallel(cfg)
    get_algo(cfg.algo).check_config(cfg)
    if cfg.embedded_task:  # its scorer's sandbox limit, its own limits
        task = get_task(cfg.data.task)
        check_sandbox(cfg, [task.source])
        task.check_config(cfg)
    return cfg


def check_tensor_parallel(cfg: Config) -> None:
    """rollout.tensor_parallel_size against the engine and the workers: an engine that shards the
    model (`Rollout.tensor_parallel`), over consecutive workers of one node. What the model's
    shape allows is layout/resolve.py `tensor_parallel`'s (it needs the model's config)."""
    tp, per_node = cfg.rollout.tensor_parallel_size, cfg.trainer.workers_per_node
    if tp == 1:
        return
    from reasonrl_fast.rollout.registry import get_rollout

    if not get_rollout(cfg.rollout.backend).tensor_parallel:
        raise ConfigError(f"rollout.tensor_parallel_size={tp} needs an engine that shards the model over "
                          f"workers; rollout.backend={cfg.rollout.backend} holds the whole model in each "
                          f"worker: set rollout.backend=vllm, or rollout.tensor_parallel_size=1")
    if per_node % tp:
        raise ConfigError(f"rollout.tensor_parallel_size={tp} does not divide trainer.workers_per_node="
                          f"{per_node}: an engine's ranks are {tp} consecutive workers of one node")


# The lowest lr bf16 master weights train at with round-to-nearest. bf16 keeps 8 significant
# bits, so the bf16 values around |w| are 2^(floor(log2|w|) - 7) apart and a new weight rounds
# back to the old one unless the step exceeds half that spacing. An AdamW step moves a weight by
# about lr (|m / sqrt(v)| ~ 1 while its gradient keeps a sign, less when it does not), and an
# LLM's weights sit around |w| ~ 0.01-0.02 (init std 0.02: median |w| 0.0135, in [2^-7, 2^-6)):
# half the spacing there is 2^-7 * 2^-8 = 2^-15 ~ 3.05e-5. Below it the median weight never moves
# (benchmarks/RESULTS.md §18: at lr 1e-6 about 2 % of the elements of a 0.02-std matrix do); at
# it, about half of them (|w| < 2^-6) can.
BF16_MIN_LR = 2.0 ** -15


def check_bf16_lr(cfg: Config) -> None:
    """ConfigError when bf16 master weights would round their updates away: a learning rate (the
    LM's, and FlowRL's Z-head group's, which is held in the LM's dtype) below BF16_MIN_LR without
    stochastic rounding; or stochastic rounding asked for over weights that are not bf16."""
    o, bf16 = cfg.optim, cfg.model.dtype == "bfloat16"
    if o.bf16_stochastic_round and not bf16:
        raise ConfigError(f"optim.bf16_stochastic_round=true needs model.dtype=bfloat16, got "
                          f"model.dtype={cfg.model.dtype!r}: float32 master weights keep every update "
                          f"and are not rounded to bf16")
    if not bf16 or o.bf16_stochastic_round:
        return
    lrs = {"optim.lr": o.lr}
    if get_algo(cfg.algo).zhead:
        lrs["optim.lr x flowrl.zhead_lr_mult"] = o.lr * cfg.flowrl.zhead_lr_mult
    for key, lr in lrs.items():
        if 0 < lr < BF16_MIN_LR:  # 0: a group meant not to move
            raise ConfigError(f"model.dtype=bfloat16 with {key}={lr:g}: below {BF16_MIN_LR:.3g}, half of "
                              f"bf16's spacing at a typical weight (|w| ~ 0.01), an AdamW step rounds away "
                              f"and the weights do not train; set model.dtype=float32, or "
                              f"optim.bf16_stochastic_round=true")


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults <- YAML file <- dotted overrides, type-checked against the dataclasses."""
    layers = [_load_yaml(path)] if path else []
    if overrides:
        layers.append(_parse_overrides(overrides))
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), *layers)
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = redact_text(str(e).splitlines()[0])
        if key in SECRET_KEYS:  # OmegaConf's message may quote the value
            msg = "not a valid value (not shown: a secret)"
        raise ConfigError(f"config key {key!r}: {msg}" if key else msg) from None
    except RecursionError:  # what _check_raw lets through nests no deeper than a list: a guard only
        raise ConfigError("the settings nest too deeply") from None
    return validate(obj)


# How the settings' YAML (the config file and each override's value) reads a plain scalar. YAML
# 1.1, which PyYAML and OmegaConf follow, reads yes/no/on/off as booleans, 017 as octal 15,
# 0x10, 0b11, 1_000 and 1:30 (sexagesimal, 90) as ints. Here only true/false (any case YAML 1.2
# allows) are booleans, an int is decimal digits without a leading zero, a float is decimal with
# a point or an exponent (1e-4, .5, 3.0) or .inf/.nan (which the finite check refuses); every
# other plain scalar stays a string. A string where a bool, int or float setting is expected is
# then refused by `_check_raw` with the key, unless it is written as such a number ("5" is 5).
_INT_TEXT = r"[-+]?(?:0|[1-9][0-9]*)"
_FLOAT_TEXT = r"[-+]?(?:(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)"
_BOOL_TAG, _INT_TAG, _FLOAT_TAG = (f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float"))


@functools.cache
def _settings_loader():
    """OmegaConf's own YAML loader (duplicate keys refused, alias expansion bounded) with the
    scalar rules above."""
    try:
        from omegaconf._yaml import get_yaml_loader
    except ImportError:  # omegaconf 2.3
        from omegaconf._utils import get_yaml_loader
    base = get_yaml_loader()

    class SettingsLoader(base):
        pass

    SettingsLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_BOOL_TAG, _INT_TAG, _FLOAT_TAG)]
        for first, resolvers in base.yaml_implicit_resolvers.items()}
    SettingsLoader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                         list("tTfF"))
    SettingsLoader.add_implicit_resolver(_INT_TAG, re.compile(f"^{_INT_TEXT}$"), list("-+0123456789"))
    SettingsLoader.add_implicit_resolver(
        _FLOAT_TAG, re.compile(rf"^(?:{_FLOAT_TEXT}|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."))
    return SettingsLoader


def _parse_yaml(text: str, where: str):
    """`text` read by the settings' loader, or a ConfigError starting with `where`. The message
    gives YAML's problem and its place, not the text around it (which may hold a secret)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # an argument's bytes that were not UTF-8, kept as lone surrogates
        raise ConfigError(f"{where}: not UTF-8 text (bytes the command line could not decode)") from None
    try:
        return yaml.load(text, Loader=_settings_loader())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(part for part in (e.context, e.problem) if part)
        raise ConfigError(f"{where}: not valid YAML ({what}{at})") from None
    except yaml.YAMLError as e:  # the reader's: a control character, a NUL, a lone surrogate
        raise ConfigError(f"{where}: not valid YAML ({' '.join(str(e).split())})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None


def _parse_overrides(overrides) -> DictConfig:
    """The dotted `key=value` overrides as one DictConfig, each value read by the settings' loader
    and checked as written (`_check_raw`); a ConfigError naming the override that cannot be."""
    merged = OmegaConf.create()
    for o in overrides:
        _check_override(o)
        key, _, text = o.partition("=")
        where = f"override {_shown_override(o)!r}"
        value = _parse_yaml(text, where)
        nested = value
        for name in reversed(key.split(".")):
            nested = {name: nested}
        _check_raw(nested, Config)
        try:
            OmegaConf.update(merged, key, value, merge=True)
        except (OmegaConfBaseException, ValueError, TypeError, RecursionError) as e:
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"{where}: {first}") from None
    return merged


def _shown_override(override: str) -> str:
    """An override as an error message may show it: a secret's value redacted."""
    key, eq, value = override.partition("=")
    shown = f"{key}{eq}{redact_value(key, value)}" if eq else redact_text(override)
    return shown if len(shown) <= 200 else f"{shown[:100]}... ({len(shown)} characters)"


def _check_finite(section, at: str = "") -> None:
    """Every number a finite one, and every int one that fits in 64 bits. A section's range
    checks compare (lr > 0, temperature > 0), and inf passes those while nan fails none of
    `not x < 0`: no setting means either; a larger int overflows torch's and numpy's integers."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            _check_finite(value, f"{at}{f.name}.")
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                _fail(f"{at}{f.name}", value, "must be a finite number")
            if isinstance(v, int) and not -2**63 <= v < 2**63:  # what torch and numpy hold
                _fail(f"{at}{f.name}", value, "must fit in 64 bits")


def _check_not_redacted(section, at: str = "", skip: tuple[str, ...] = ()) -> None:
    """No setting the run uses holds the marker `to_yaml` writes in place of a secret: a run's
    config.yaml given back as the config file would otherwise send "<redacted>" as the GenRM's
    key, and the GenRM's refusals leave every answer unpenalised (fail open). Sections in `skip`
    are not used by the run (the GenRM's, unless the algorithm asks it). The eval command given
    a FAPO run's config.yaml is refused too (it cannot tell), and the message says how to go on:
    `fapo.genrm.api_key=''` empties the key."""
    for f in dataclasses.fields(section):
        value, key = getattr(section, f.name), f"{at}{f.name}"
        if key.startswith(skip):
            continue
        if dataclasses.is_dataclass(value):
            _check_not_redacted(value, f"{key}.", skip)
        elif holds_redacted(value):
            how = (f"; or empty it ({key}='') for ${API_KEY_ENV}" if key == "fapo.genrm.api_key" else "")
            raise ConfigError(f"{key} holds {REDACTED}, what a run's config.yaml writes in place of a secret: "
                              f"give the real value{how}")


def _setting_kind(hint) -> tuple[type | None, bool]:
    """(the scalar type, whether a list of it) of a setting's type hint; Optional unwrapped."""
    if typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is list:
        return typing.get_args(hint)[0], True
    return hint, False


def _check_scalar(key: str, value, kind) -> None:
    """One value as written against its setting's scalar type (see `_check_raw`)."""
    if isinstance(value, str) and value.startswith("${"):  # an interpolation: checked once resolved
        return
    if kind is bool and not isinstance(value, bool) and not (
            isinstance(value, str) and value.lower() in ("true", "false")):
        _fail(key, value, "must be true or false")
    if isinstance(value, (list, dict)):
        _fail(key, value, "must be a single value, not a list or a mapping")
    if kind in (int, float) and not isinstance(value, bool):
        # inf and nan, as Python writes them, go on to the finite check, which names them
        text = _INT_TEXT if kind is int else f"{_INT_TEXT}|{_FLOAT_TEXT}|(?i:[-+]?(?:inf|infinity|nan))"
        if (isinstance(value, str) and not re.fullmatch(text, value.strip())
                or kind is int and isinstance(value, float)):
            what = "a whole number" if kind is int else "a number"
            _fail(key, value, f"must be {what} written in decimal digits (017, 0o17, 0x10, 1_000 and 1:30 are "
                              f"not read as numbers{', nor 1e3 or 2.0 as a whole one' if kind is int else ''})")


def _check_raw(raw, cls, at: str = "") -> None:
    """What the merge would let through or name badly, in one file's or one override's settings
    as written, against the dataclass `cls` of their section:
    - a bool setting takes true or false (YAML's, or the words quoted) and nothing else.
      OmegaConf alone reads any number but 0, and "1", as true: a value meant for another key,
      or a count, would switch the setting on without a word (int and float settings already
      refuse a bool);
    - an int or float setting takes a number written in decimal (the loader's rules above):
      OmegaConf alone would read the string "017" as 17 and "1_000" as 1000, and an int setting
      refuses a float here with the key named;
    - a list setting (optim.betas, data.train_files) is given whole, as a list: `optim.betas.0=`
      makes a mapping, which OmegaConf's merge refuses without naming the key;
    - a section (model, trainer, fapo.genrm, ...) is given as a mapping of its settings: a lone
      value in its place (`trainer=5`) is named here, where OmegaConf's merge names no key.
    Unknown keys are left to the merge, which names them."""
    if not isinstance(raw, dict):
        return
    hints = get_type_hints(cls)
    for key, value in raw.items():
        hint = hints.get(key)
        if hint is None:
            continue
        name = f"{at}{key}"
        if dataclasses.is_dataclass(hint):
            if value is not None and not isinstance(value, dict):
                _fail(name, value, f"a section, not a value: give its settings ({name}.NAME=VALUE)")
            _check_raw(value, hint, f"{name}.")
            continue
        kind, is_list = _setting_kind(hint)
        if value is None:  # null: the merge says whether the setting may be unset
            continue
        if is_list:
            if isinstance(value, dict):
                _fail(name, value, f"a list setting is given whole, such as {name}=[...]")
            if not isinstance(value, list) and not (isinstance(value, str) and value.startswith("${")):
                _fail(name, value, f"must be a list, such as {name}=[...]")
            for v in value if isinstance(value, list) else []:
                _check_scalar(name, v, kind)
        else:
            _check_scalar(name, value, kind)


# A dotted key: names joined by dots (OmegaConf would read `a..b` or `=v` as a key '' of some section)
_OVERRIDE_KEY = re.compile(r"\w+(\.\w+)*", re.ASCII)


def _check_override(override: str) -> None:
    """A ConfigError unless `override` is `dotted.key=value` (the value may be empty: null)."""
    key, eq, _ = override.partition("=")
    if not eq or not _OVERRIDE_KEY.fullmatch(key):
        raise ConfigError(f"override {_shown_override(override)!r}: expected key=value with a dotted key, such as "
                          f"trainer.steps=3")


def _load_yaml(path: str) -> dict:
    """The config file's sections, checked as written (`_check_raw`), or a ConfigError saying why
    the file cannot be one."""
    where = f"config file {path!r}"
    if not os.path.exists(path):
        hint = ("; settings are given as key=value" if not path.endswith((".yaml", ".yml"))
                and "/" not in path else "")
        raise ConfigError(f"{where}: no such file{hint}")
    if os.path.isdir(path):
        raise ConfigError(f"{where} is a directory, not a YAML file")
    try:  # a FIFO or a device would block the read, or never end it: refused before it is opened
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError as e:
        raise ConfigError(f"{where}: cannot be read ({e.strerror})") from None
    if not regular:
        raise ConfigError(f"{where} is not a regular file (a FIFO, socket or device): give a YAML file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"{where}: cannot be read ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not a UTF-8 text file ({e.reason})") from None
    loaded = _parse_yaml(text, where)
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{where}: {_NOT_SECTIONS}, got {type(loaded).__name__}")
    if not loaded:  # an empty or truncated file is more likely a mistake than a wish for the defaults
        raise ConfigError(f"{where} is empty (no settings): give its sections, or leave the file out for "
                          f"the defaults")
    _check_raw(loaded, Config)
    return loaded


_NOT_SECTIONS = "expected a mapping of sections (algo:, model:, data:, ...)"


def to_yaml(cfg: Config) -> str:
    """The settings as YAML, secrets redacted (redact.py): what a run writes to its config.yaml,
    which other users may read. Loading it back refuses the redacted values (`validate`)."""
    return OmegaConf.to_yaml(redact_settings(dataclasses.asdict(cfg)))


def config_hash(*parts) -> str:
    """Stable short hash of dataclasses / plain values (used to key the SFT cache)."""
    blob = json.dumps([dataclasses.asdict(p) if dataclasses.is_dataclass(p) else p for p in parts],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_argv(argv: list[str] | tuple[str, ...]) -> Config:
    """A command's `[config.yaml] key=value ...` arguments (train, eval, plan): the first is the
    YAML file unless it is a setting (it has no `=`), the rest are dotted overrides."""
    path = argv[0] if argv and "=" not in argv[0] else None
    return load_config(path, list(argv[1:] if path else argv))
