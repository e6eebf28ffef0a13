"""The shared settings sections: one dataclass per section, each with its own range checks
(`check`, config/checks.py) and one docstring per field. An algorithm's, a task's, an engine's
or a GenRM backend's own settings are not here: each plug-in declares its section beside its
code (registry.py), and schema.py joins them to these."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Optional

from reasonrl_fast.config.checks import MAX_WAIT_S, SEED_MAX, _Checks, _fail, tristate  # noqa: F401
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.registry import ALGOS, ROLLOUTS, TASKS, TOOLS

FILTER_METRICS = ("acc", "score")
"""data.filter_groups: the scorer's values a group's spread is measured on (trainer/dynamic.py)."""
SHAPED_FILTERS = ("reward", "seq_reward", "seq_final_reward")
"""What verl also offers and data.filter_groups refuses with its reason (the shaped reward)."""

SANDBOX_SHARE = 3
"""reward.sandbox_timeout_s, when unset, is reward.timeout_s / SANDBOX_SHARE: the old fixed
defaults (30 s, 10 s)."""


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


VAL_SET_NAME = re.compile(r"^[a-z0-9][a-z0-9_]*$")
"""A validation set's name: its metrics are val/<name>/<metric>."""


@dataclass
class ValSetConfig(_Checks):
    """One validation set of data.val_sets: the benchmark a paper reports on its own, with its
    own samples per prompt, sampling and metrics (docs/trainer.md §Validation)."""

    name: str = ""
    """Its name in the metrics, `val/<name>/mean@<n>`: lower-case letters, digits and _."""
    files: list[str] = field(default_factory=list)
    """Its jsonl/parquet files (the training records' format). Empty: the embedded task's
    held-out split (data.val_size prompts; the embedded task only)."""
    sources: list[str] = field(default_factory=list)
    """As data.val_sources, for `files`: the data_source each file's records carry (the CPU
    rehearsal gives its stand-in records these)."""
    n: int = 1
    """Samples per prompt: mean@n, the paper's avg@n."""
    k: list[int] = field(default_factory=list)
    """pass@k for each k (each at most n). Empty: n, when n > 1."""
    maj: bool = False
    """maj@n as well: the share of prompts whose most frequent answer is right (answer scorers
    only: math, dapo, boxed)."""
    temperature: Optional[float] = None
    """Its sampling temperature. Unset: rollout.val_temperature."""
    top_p: Optional[float] = None
    """Its nucleus threshold. Unset: rollout.val_top_p (or top_p)."""
    scorer: Optional[str] = None
    """The scorer of its records, whatever their data_source: math, dapo (DAPO's "Answer:" rule,
    what aime* routes to) or boxed (the box verifier FAPO's runs validate with). Unset: each
    record's data_source routes it. Needs the default routing (data.reward_fn empty)."""

    def check(self, at: str) -> None:
        if self.scorer is not None:
            self._one_of(at, "scorer", ("math", "dapo", "boxed"))
        if not VAL_SET_NAME.match(self.name or ""):
            _fail(f"{at}name", self.name, "a validation set needs a name of lower-case letters, digits and _ "
                  "(its metrics are val/<name>/...)")
        self._positive(at, "n")
        self._file_list(at, "files")
        if any(not s.strip() for s in self.sources):
            _fail(f"{at}sources", self.sources, "an empty data_source")
        for k in self.k:
            if not 1 <= k <= self.n:
                _fail(f"{at}k", self.k, f"each k must be in [1, n={self.n}]")
        if self.temperature is not None and self.temperature < 0:
            _fail(f"{at}temperature", self.temperature, "must be >= 0")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            _fail(f"{at}top_p", self.top_p, "must be in (0, 1]")

    def ks(self) -> list[int]:
        """The k of its pass@k: the one place `k` falls back."""
        return sorted(set(self.k)) if self.k else ([self.n] if self.n > 1 else [])


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
    val_sets: list[ValSetConfig] = field(default_factory=list)
    """Validation as the papers report it: one entry per benchmark, each with its own `name`,
    `files`, `n`, pass@`k`, `maj` and sampling (`ValSetConfig`), logged as val/<name>/mean@<n>
    (...) and val/accuracy, their macro average. Empty: the one set of `val_files` (or the
    embedded task's held-out split) at rollout.val_n, its metrics val/accuracy, val/pass@<k>."""
    prompts_per_step: int = 16
    """Prompts per RL step (each sampled `rollout.n` times): with `filter_groups`, the groups
    each step trains on."""
    filter_groups: Optional[str] = None
    """DAPO's dynamic sampling (docs/trainer.md §Dynamic sampling): unset (off), or the
    per-sample value whose spread keeps a group: acc (the scorer's right/wrong, DAPO's), or score
    (the scorer's raw score). A group whose samples all have the same value (all right, all
    wrong) has no advantage to learn from and is dropped; further rounds of
    `gen_prompts_per_step` prompts are generated until `prompts_per_step` groups are kept. The
    algorithm's shaped reward is not offered: overlong shaping makes an all-wrong group of
    different lengths look mixed."""
    gen_prompts_per_step: Optional[int] = None
    """Dynamic sampling: prompts per generation round (verl's gen_batch_size), at least
    prompts_per_step. Unset: prompts_per_step."""
    max_gen_rounds: int = 10
    """Dynamic sampling: generation rounds a step may take (DAPO's script: 10) before the run
    stops with an error naming what it kept, as verl does; 0: no limit (a policy that gets every
    prompt right, or none, then never ends its step)."""
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
    shuffle: bool = True
    """Shuffle the training prompts (each epoch, seeded)."""
    task: str = "addition"
    """Built-in task when `train_files` is empty: addition (math answers in \\boxed{}), code
    (short stdin/stdout programming problems, scored in the sandbox), genrm (judge an addition
    solution: the index of its earliest wrong step, or -1, scored by the GenRM reward; its
    solutions come from the addition demonstrations, with carry_slip_prob and flaw_prob) or
    partition (a number of `digits` digits as the sum of two positive numbers: many right answers
    per prompt, held-out validation numbers) or multiply (products, some learnt at once and some
    that take a calculator call: data.multiply.*). The choices are the keys of tasks.TASKS; a task's
own settings are its section under data. (data.partition.styles)."""
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
        self._check_filter(at)
        self._check_val_sets(at)
        self._file_list(at, "train_files")
        self._file_list(at, "val_files")
        for name in ("train_sources", "val_sources"):
            if any(not s.strip() for s in getattr(self, name)):
                _fail(f"{at}{name}", getattr(self, name), "an empty data_source")
        if self.reward_fn and ":" not in self.reward_fn:
            _fail(f"{at}reward_fn", self.reward_fn, "expected `module:function` or `path/to/file.py:function`")

    def _check_filter(self, at: str) -> None:
        """Dynamic sampling's three settings. A generation batch without the filter is refused:
        every generated group would train, which prompts_per_step already says."""
        self._not_negative(at, "max_gen_rounds")
        f = self.filter_groups
        if f in SHAPED_FILTERS:
            _fail(f"{at}filter_groups", f, "the shaped reward is not a filter metric: overlong shaping gives an "
                  "all-wrong group of different lengths different rewards, so it would be kept with nothing to "
                  "learn from; use acc (DAPO's) or score")
        if f is not None:
            self._one_of(at, "filter_groups", FILTER_METRICS)
        g = self.gen_prompts_per_step
        if g is None:
            return
        if f is None:
            _fail(f"{at}gen_prompts_per_step", g, "needs data.filter_groups: without the filter every generated "
                  "group trains, so set data.prompts_per_step instead")
        if g < self.prompts_per_step:
            _fail(f"{at}gen_prompts_per_step", g, f"below data.prompts_per_step={self.prompts_per_step}: a round "
                  "generates at least the groups a step trains on")

    def _check_val_sets(self, at: str) -> None:
        if self.val_sets and (self.val_files or self.val_sources):
            _fail(f"{at}val_files", self.val_files, "and data.val_sets both set: val_files is the one-set "
                  "shorthand; list its files as an entry of data.val_sets")
        names = []
        for i, entry in enumerate(self.val_sets):
            entry.check(f"{at}val_sets[{i}].")
            if entry.scorer and self.reward_fn:
                _fail(f"{at}val_sets[{i}].scorer", entry.scorer, f"picks one of the default routing's scorers; "
                      f"data.reward_fn={self.reward_fn!r} scores every record itself")
            if not entry.files and self.train_files:
                _fail(f"{at}val_sets[{i}].files", entry.files, "empty: only the embedded task (data.train_files "
                      "empty) has a held-out split to validate on")
            if entry.name in names:
                _fail(f"{at}val_sets[{i}].name", entry.name, "a second set of that name (their metrics would mix)")
            names.append(entry.name)

    def gen_prompts(self) -> int:
        """Prompts per generation round: the one place gen_prompts_per_step falls back."""
        return self.gen_prompts_per_step or self.prompts_per_step


TOOL_FORMATS = ("plain", "hermes")
"""rollout.tool_format's choices: the keys of tools/calls.py `FORMATS`."""


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
    max_sequence_tokens: int = 0
    """Longest prompt and response together, in tokens (0: no cap of its own, the longest sequence
    is data.max_prompt_length + max_new_tokens). Set, each response may take min(max_new_tokens,
    max_sequence_tokens - its prompt's length) tokens: a short prompt leaves its response more
    room, as Megatron's MAX_SEQ_LENGTH and slime's rollout_max_context_len do. Must exceed
    data.max_prompt_length; DAPO's overlong shaping (its buffer counts back from one fixed
    length) is refused with it."""
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
    workers: int = 1
    """trainer.placement=split only: the rollout engines, each on rollout.tensor_parallel_size
    workers (devices) of its own beside the trainer's; one engine spans one node. Colocated
    placement ignores it (each trainer worker runs its own engine)."""
    tools: list[str] = field(default_factory=list)
    """Tools the policy may call mid-answer (multi-turn rollouts, docs/trainer.md §Tools): names
    in tools.TOOLS (calculator, python: a sandboxed code interpreter) or "package.module:function"
    paths of tools of one's own. Empty: one turn, no tools."""
    tool_format: str = "plain"
    """How the policy writes a call and reads its answer (tools/calls.py): plain
    (`<NAME>ARGUMENT</NAME>`, answered `<result>TEXT</result>`: a model without a chat template,
    as the embedded one) or hermes (Qwen2.5/Qwen3's `<tool_call>` JSON, answered in tool messages
    of the tokenizer's chat template)."""
    max_turns: int = 2
    """With tools: the calls (turns that call) a sample may make; the response's length limit
    (max_new_tokens or max_sequence_tokens) counts its observations' tokens too."""
    tool_timeout_s: float = 10.0
    """With tools: one call's time limit; past it the tool's worker is killed and the policy
    sees an error (tool/timeouts counts them)."""
    tool_workers: int = 1
    """With tools: each rollout worker's tool worker processes (calls of one turn run side by
    side)."""
    cpus_per_worker: Optional[int] = None
    """CPU runs, trainer.placement=split and the eval command: a rollout worker's CPU slots and
    torch threads. Unset: trainer.cpus_per_worker. On shared cores the roles need not match: where
    the rollout worker mostly waits (a remote reward or judge), the trainer worker can take the
    threads (docs/trainer.md §Placement). Colocated placement ignores it (the trainer's workers
    run the engines)."""

    def check(self, at: str = "rollout.") -> None:
        self._one_of(at, "backend", tuple(ROLLOUTS))  # read when checked: a registered engine counts
        self._one_of(at, "decoder", ("auto", "model"))
        self._one_of(at, "correction", ("none", "token_tis", "seq_tis"))
        self._one_of(at, "tool_format", TOOL_FORMATS)
        self._positive(at, "max_turns", "tool_workers")
        self._duration(at, "tool_timeout_s")
        for t in self.tools:  # a path is checked by the preflight, which imports it
            if not (isinstance(t, str) and (t in TOOLS or ":" in t)):
                _fail(f"{at}tools", self.tools, f"{t!r} is neither a tool ({TOOLS.known()}) nor a "
                      f"'package.module:function' path")
        self._positive(at, "n", "max_new_tokens", "temperature", "sync_every", "is_cap", "tensor_parallel_size",
                       "val_n", "workers")
        self._not_negative(at, "val_temperature", "max_sequence_tokens")  # 0: greedy validation (GREEDY_BELOW)
        for name in ("top_p", "val_top_p"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                _fail(f"{at}{name}", value, "must be in (0, 1]")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            _fail(f"{at}gpu_memory_utilization", self.gpu_memory_utilization, "must be in (0, 1]")
        if self.kv_cache_memory_bytes is not None:
            self._positive(at, "kv_cache_memory_bytes")
        if self.cpus_per_worker is not None:
            self._positive(at, "cpus_per_worker")

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
    offload: str = "none"
    """none, or params+optimizer: FSDP2's CPU offload (docs/trainer.md §Offload). Each worker's
    shards of the master weights, their gradients and the AdamW states live in host memory; a
    layer's shards go to the device to be gathered for its forward and backward, its gradients
    come back, and the optimizer steps on the host. Device memory for host memory and PCIe
    transfers (verl's param_offload + optimizer_offload). Needs FSDP2: trainer.sharding fsdp
    or auto, which it then resolves to fsdp on any device."""
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
    placement: str = "colocated"
    """Where the two roles run (docs/trainer.md §Placement): colocated (each trainer worker also
    runs the rollout engine, which sleeps during the update) or split (rollout.workers engines on
    workers of their own; the trainer's rank 0 sends them the weights after each update)."""
    sequence_parallel_size: int = 1
    """Ulysses sequence parallel (docs/trainer.md §Sequence parallel): trainer workers that split
    each packed row's tokens between them, trading them for attention heads at each attention
    (models/ulysses.py); it must divide the trainer workers, who train on
    workers / sequence_parallel_size shares of the batch. 1: each worker runs its rows whole."""
    max_staleness: int = 0
    """split placement only: how many updates behind the trained policy a sample's weights may
    be. 0: each step samples the weights of the update before it (on-policy); k >= 1 keeps up to
    k steps of generation in flight while the trainer updates (rollout.correction corrects the
    gap; docs/math.md §Rollout correction)."""

    def check(self, at: str = "trainer.") -> None:
        self._one_of(at, "logger", ("tensorboard", "wandb", "none"))
        self._one_of(at, "placement", ("colocated", "split"))
        self._one_of(at, "sharding", ("auto", "fsdp", "replicate"))
        self._one_of(at, "offload", ("none", "params+optimizer"))
        self._positive(at, "nnodes", "workers_per_node", "cpus_per_worker", "sequence_parallel_size")
        self._duration(at, "collective_timeout_s")
        self._not_negative(at, "steps", "save_every", "keep_checkpoints", "val_every", "max_staleness")
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
    val_sets: bool = False
    """Evaluate the validation sets of data.val_sets (a run's config.yaml's), each as the trainer
    validates it: its files, n, k, maj and sampling, in place of eval.files, eval.n, eval.k and
    eval.temperature / top_p (docs/eval.md §Validation sets)."""
    val_step: Optional[int] = None
    """With val_sets: sample with the seeds of the trainer's validation at this step (trainer.seed
    and the stream val/<step>/<name>): the checkpoint of that step then gets the numbers its
    run logged. Unset: eval.seed."""

    def check(self, at: str = "eval.") -> None:
        if self.val_step is not None:
            if not self.val_sets:
                _fail(f"{at}val_step", self.val_step, "needs eval.val_sets=true (the trainer's seeds are a set's)")
            self._not_negative(at, "val_step")
        if self.val_sets and self.target:
            _fail(f"{at}target", self.target, "with eval.val_sets: a target is compared on eval.files' prompts")
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


class Root(_Checks):
    """What the run's settings answer at the top level (the fields are `Sections`' and the
    plug-ins', joined in schema.py)."""

    @property
    def embedded_model(self) -> bool:
        """The run's model is the embedded tiny one (model.path empty), warm-started on
        data.task's demonstrations."""
        return not self.model.path

    @property
    def embedded_task(self) -> bool:
        """The run trains on the embedded task data.task (data.train_files empty)."""
        return not self.data.train_files

    @property
    def max_sequence(self) -> int:
        """The run's longest sequence, prompt and response: data.max_prompt_length +
        rollout.max_new_tokens, or rollout.max_sequence_tokens where it caps that lower. What the
        engines' caches, the model's context and the planner are sized for."""
        whole = self.data.max_prompt_length + self.rollout.max_new_tokens
        cap = self.rollout.max_sequence_tokens
        return min(whole, cap) if cap else whole

    @property
    def max_response(self) -> int:
        """The run's longest response: rollout.max_new_tokens, or what rollout.max_sequence_tokens
        leaves a prompt of one token where that is less."""
        return self.response_limit(1)

    @property
    def rollout_cpus(self) -> int:
        """A rollout worker's CPU slots and threads: rollout.cpus_per_worker, else
        trainer.cpus_per_worker."""
        return self.rollout.cpus_per_worker or self.trainer.cpus_per_worker

    def response_limit(self, prompt_tokens: int) -> int:
        """The tokens a response to a prompt of `prompt_tokens` tokens may take (at least 1)."""
        r, cap = self.rollout.max_new_tokens, self.rollout.max_sequence_tokens
        return max(1, min(r, cap - prompt_tokens)) if cap else r

    def check(self, at: str = "") -> None:
        """The top-level settings' own checks; the sections' are `check_sections`'s, the
        cross-section rules `validate`'s."""
        self._one_of(at, "algo", ALGOS)


@dataclass
class Sections(Root):
    """The shared sections: what every run has, whatever its algorithm, task, engine or GenRM
    backend. The run's `Config` is these plus the plug-ins' own sections (schema.py)."""

    algo: str = "flowrl"
    """flowrl, grpo, or fapo (GRPO with +1/-1 rewards and flawed positives lowered by a GenRM)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def check_sections(section, at: str = "") -> None:
    """`section`'s own checks, then those of every section in it, each with its dotted name: so
    neither a shared section nor a plug-in's can be left unchecked."""
    section.check(at)
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            check_sections(value, f"{at}{f.name}.")


__all__ = ["DataConfig", "EvalConfig", "ValSetConfig", "ModelConfig", "OptimConfig", "RewardConfig", "RolloutConfig", "SANDBOX_SHARE",
           "Root", "SFTConfig", "Sections", "TrainerConfig", "check_sections"]
