"""`python -m reasonrl_fast.plan CONFIG [key=value ...] [--gpus N] [--gpu-memory-gb 80] [--host-memory-gb 1024]
[--device gpu|cpu]`

The memory one worker (one GPU, or one CPU process) of a training run needs, term by term, in
the two phases of a step: the rollout (the engine generating) and the update (log-prob passes,
forward and backward, optimiser step). It reads the model's config.json only, never weights: from
`model.path`, else the shipped shape of a model the configs name (layout/shipped_shapes.py). Exit status
0 when the peak fits the device, 1 when it does not (with the first knob to turn), 2 on bad input;
either way, where the rollout engine has room for too few full-length sequences at once, the
rollout.tensor_parallel_size that gives it room. With split placement (trainer.placement=split) the
trainer workers and the rollout workers hold different things, and each role gets its own table.
docs/scaling.md explains every row and the knobs.

The estimate is an upper bound of the worst step: every sequence at the run's longest,
data.max_prompt_length + rollout.max_new_tokens or rollout.max_sequence_tokens. What the workers hold and how they run it (sharding, dtypes, attention,
packing, the fused head, the engine's memory) is the Layout the workers build from
(layout/resolve.py `resolve`); this module only counts its bytes. It imports no torch. On CPU it is what the worker's `memory/peak_gb` (its max RSS) measures,
checked against real runs by tests/test_plan.py."""

from __future__ import annotations

import argparse
import copy
import functools
import math
import sys
from dataclasses import dataclass, field

from reasonrl_fast import cli
from reasonrl_fast.algos import get_algo
from reasonrl_fast.config import Config, load_argv
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.genrm.launch import DEFAULT_MAX_BATCH
from reasonrl_fast.layout import SYNC_BUCKET_BYTES, Layout, dtype_bytes, largest_mini_batch, resolve, tensor_parallel
from reasonrl_fast.layout.micro import split
from reasonrl_fast.layout.shape import (Shape, context_problem, genrm_context_problem, model_fields,
                                        shape_from_config, zhead_params)
from reasonrl_fast.models.tiny import tiny_shape
from reasonrl_fast.rollout.registry import get_rollout
from reasonrl_fast.util import chunk_width, meminfo_bytes, rollout_sequences

GIB = 2 ** 30
# On a GPU: room the estimate leaves for what it does not count: the CUDA context (one per
# process, the vLLM engine shares the worker's), NCCL's communicator buffers, cuBLAS workspaces,
# and the caching allocator's fragmentation (blocks cached at sizes the next request cannot use).
GPU_RESERVE_GIB = 4.0
# On CPU: the worker process before any model: python, torch, transformers, Ray's worker runtime
# and this package. Measured as `memory/peak_gb` (max RSS) of a 2-worker GRPO run of a 2-layer,
# hidden-32 model (all model terms below 1 MiB): 0.537 GiB with torch 2.13 (CPU), transformers
# 5.24, ray, Linux x86-64 (benchmarks/RESULTS.md §16).
CPU_BASELINE_GIB = 0.54
# The fewest full-length sequences a rollout engine should hold in flight (its KV cache), or its
# whole batch where that is less. A step samples the engine's prompts x rollout.n sequences at
# once (util.rollout_sequences); an engine with room for a few decodes them a few at a time, each
# decode step reading all its weights for a handful of tokens: a serial rollout that takes most of
# the step. Below this the planner names the rollout.tensor_parallel_size that gives it.
MIN_SEQUENCES_IN_FLIGHT = 32
# The sizes of vLLM's tensor parallelism the advice tries: an engine's ranks are consecutive
# workers of one node (config/validate.py check_tensor_parallel), at most 8 GPUs.
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
# The Ulysses sizes the advice tries (trainer.sequence_parallel_size): it must divide the heads,
# and its all-to-all is best kept in one node's NVLink domain.
SEQUENCE_PARALLEL_SIZES = (2, 4, 8)
# The GPU counts the advice tries beyond the run's own: one node of 8, then nodes of 8.
GPU_COUNTS = (8, 16, 32, 64, 128, 256, 512)
# Host memory per GPU node the offloaded states may take, unless --host-memory-gb says: a
# conservative share of an 8-GPU node's (an 8 x H100 node has 1-2 TiB), leaving the rest to the
# data loader, the page cache and the rollout engines' sleeping weights.
HOST_MEMORY_GIB = 1024.0
OFFLOAD = "params+optimizer"


# ---------------------------------------------------------------- one forward's tokens


@dataclass(frozen=True)
class Forward:
    rows: int  # rows of one forward (packed: sequences' worth of rows)
    tokens: int  # positions the layers see (flash-attn packed: real tokens; else rows x longest)
    logit_rows: int  # positions whose next token is a response token (the head's rows)
    mask: int  # elements of the attention mask sdpa reads (0 with flash-attn)


def forward_tokens(cfg: Config, layout: Layout) -> Forward:
    """The worst forward of the update: the largest mini-batch of the largest worker's share, cut
    into micro-batches of optim.micro_batch_tokens as the workers cut it (layout/micro.py), every
    sequence at its longest."""
    seq, r = cfg.max_sequence, cfg.max_response
    sp = layout.sequence_parallel  # a group of sp workers trains on their samples together
    rows = largest_mini_batch(cfg, layout.world // sp)
    budget = cfg.optim.micro_batch_tokens
    if layout.packed:
        # a packed micro-batch holds up to the budget of real tokens, more sequences than the
        # longest ones when they are shorter (or one sequence longer than the budget, alone)
        tokens = min(max(budget, seq), rows * seq) if budget else rows * seq
        # a packed micro-batch of short prompts holds more responses: at most R of every R + 1 tokens
        logit_rows = min(rows * r, tokens * r // (r + 1))
        if sp > 1:  # one row cut over the group: a worker's share of its tokens and head rows, no
            # mask (models/ulysses.py attends over each sequence by itself)
            return Forward(1, -(-tokens // sp), -(-logit_rows // sp), 0)
        if layout.one_row:  # one row, flash-attn's variable-length kernels: no mask
            return Forward(-(-tokens // seq), tokens, logit_rows, 0)
        # sdpa: rows as long as the longest sequence (trainer/policy.py make_packed_batch), each with
        # its block-diagonal mask
        packed_rows = -(-tokens // seq)
        return Forward(packed_rows, packed_rows * seq, logit_rows, packed_rows * seq * seq)
    rows = max(len(g) for g in split([seq] * rows, budget, False))
    flash = layout.attention.startswith("flash")
    return Forward(rows, rows * seq, rows * r, 0 if flash else rows * seq * seq)


def layer_bytes(s: Shape, c: int, flash: bool) -> int:
    """Bytes autograd keeps per token for one decoder layer in compute dtype c (bytes): each RMSNorm
    its float32 input, normalised value and output; q, k, v, the attention output and o_proj's
    input (sdpa with a mask repeats k and v to every head; flash-attn reads them as they are and
    its output is o_proj's input), the float32 log-sum-exp; SwiGLU's gate, up, act(gate) and
    product. Qwen3's q/k norms add their float32 input and normalised value."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    norms = 2 * (4 + 2 * c) * s.hidden
    attn = c * (2 * q + 2 * kv) if flash else c * 5 * q
    qk = (4 + c) * (q + kv) if s.qk_norm else 0
    return norms + attn + 4 * s.heads + qk + 4 * c * s.intermediate


def activation_bytes(s: Shape, f: Forward, c: int, ckpt: bool, flash: bool) -> int:
    """The update's saved activations for one forward. Without checkpointing: every layer's; with
    it: one hidden state per layer and token, plus one layer's full set while it is recomputed.
    Plus the final norm's, and the float mask sdpa makes of the boolean one, per layer it keeps."""
    per_layer = layer_bytes(s, c, flash)
    held = (s.layers * c * s.hidden + per_layer) if ckpt else s.layers * per_layer
    masks = f.mask * (1 + c * (1 if ckpt else s.layers))
    return f.tokens * (held + (4 + 2 * c) * s.hidden) + masks


def logits_bytes(s: Shape, f: Forward, c: int, fused: bool, gpu: bool) -> int:
    """Unfused: the [rows, vocab] logits the op saves and their gradient, in compute dtype, plus the
    head's input rows. Fused: one vocabulary chunk of linear_token_logprob's backward
    (util.chunk_width) and its float32 dh accumulator."""
    n = f.logit_rows
    if not fused:
        return 2 * n * s.vocab * c + n * s.hidden * c
    width = chunk_width(n, s.hidden, s.vocab, gpu)
    chunk = n * width * c if gpu else 3 * n * (width + 1) * c  # CPU: logits, padded copy, dz
    return chunk + n * s.hidden * (4 + 2 * c)


def all_to_all_bytes(s: Shape, f: Forward, c: int, sp: int) -> int:
    """The buffers of one layer's Ulysses exchanges (models/ulysses.py) beyond what autograd keeps:
    q, k, v and the attention output, each sent from a rank's tokens and received as its heads,
    the same size both ways; key/value heads repeated until `sp` divides them."""
    kv = s.kv_heads * (sp // math.gcd(s.kv_heads, sp))
    return 2 * f.tokens * c * s.head_dim * (2 * s.heads + 2 * kv)


def kv_bytes(s: Shape, rows: int, length: int, c: int) -> int:
    """The KV cache of `rows` sequences of `length` tokens in `c`-byte elements of a model held
    whole (the GenRM's; a rollout engine counts its own, `EngineSpec.memory`)."""
    return 2 * s.layers * rows * s.kv_heads * s.head_dim * length * c


def sync_bytes(s: Shape, params: int, c: int, world: int) -> int:
    """The most the weight sync (trainer/fsdp.py `iter_full`) holds at once, its tensors gathered
    in `c`-byte elements: a bucket of parameters each under SYNC_BUCKET_BYTES closes below twice
    that, and holds its gathered flat buffer and the full tensors cut from it (2x); a larger
    parameter (the embeddings' or the head's vocabulary x hidden matrix) is gathered alone, its
    gathered rows the full tensor itself when its rows split evenly over the `world` shards, else
    cut into a second copy. Never more than the model's `params`, twice."""
    rows, largest = max((s.vocab, s.vocab * s.hidden), (s.intermediate, s.intermediate * s.hidden))
    largest *= c
    small = 2 * min(params * c, 2 * SYNC_BUCKET_BYTES)
    if largest < SYNC_BUCKET_BYTES:
        return small
    return max(small, largest * (1 if rows % world == 0 else 2))


def publish_bytes(s: Shape, params: int, c: int) -> int:
    """The most a trainer rank holds at once, beyond its shard, while it publishes the weights to
    the rollout workers (split placement, rollout/transport.py): one bucket in `c`-byte elements,
    its shards gathered in place into one rank-major buffer that rank 0 sends as it is and the
    receivers cut (runtime/shards.py), so no second copy: a bucket of parameters each under
    SYNC_BUCKET_BYTES (below twice that), or the largest parameter alone (the padding of uneven
    shards, under a row per rank and tensor, aside). Never more than the model's `params`."""
    largest = max(s.vocab, s.intermediate) * s.hidden * c
    return max(min(params * c, 2 * SYNC_BUCKET_BYTES), largest)


# ---------------------------------------------------------------- the estimate


@dataclass
class Term:
    name: str
    rollout: float  # GiB
    update: float
    note: str = ""
    knob: str = ""  # which estimate term a knob reduces (see `advise`)


@dataclass
class Estimate:
    device: str
    world: int
    memory_gib: float
    reserve_gib: float
    terms: list[Term] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # impossible settings, whatever the total
    layout: Layout | None = None  # what the workers would resolve (layout/)
    engine_sequences: float | None = None
    """Full-length sequences one rollout engine holds in flight (its KV cache over one sequence's);
    None for an engine whose cache is as long as its batch (`EngineMemory.sequences`)."""
    phases: tuple[str, str] = ("rollout", "update")
    """The two phases the columns count (split placement: a trainer worker publishes its weights
    and updates; a rollout worker generates and receives weights)."""
    rollout_workers: Estimate | None = None
    """Split placement: one rollout worker's (one engine rank's) estimate; the run fits when both
    roles fit."""
    host: list[Term] = field(default_factory=list)
    """trainer.offload on GPU: what each worker holds in host memory instead (its node holds
    `workers_per_node` of them)."""
    workers_per_node: int = 1
    host_memory_gib: float = HOST_MEMORY_GIB
    """Host memory per node the offloaded states may take."""

    @property
    def rollout(self) -> float:
        return sum(t.rollout for t in self.terms)

    @property
    def update(self) -> float:
        return sum(t.update for t in self.terms)

    @property
    def peak(self) -> float:
        return max(self.rollout, self.update)

    @property
    def phase(self) -> str:
        return self.phases[1] if self.update >= self.rollout else self.phases[0]

    @property
    def host_each(self) -> float:
        """GiB of host memory one worker holds for offloaded states, at its larger phase (0 without
        offload)."""
        return max(sum(t.rollout for t in self.host), sum(t.update for t in self.host))

    @property
    def host_per_node(self) -> float:
        """GiB of host memory the node's workers hold for offloaded states (0 without offload)."""
        return self.workers_per_node * self.host_each

    @property
    def fits_device(self) -> bool:
        """The peak of this table's workers fits their device (or, on CPU, their share of the host)."""
        return not self.problems and self.peak <= self.memory_gib - self.reserve_gib

    @property
    def fits_alone(self) -> bool:
        """The workers of this table fit (split placement: one role, whatever the other's), and
        their node's host memory holds what they offload."""
        return self.fits_device and self.host_per_node <= self.host_memory_gib

    @property
    def fits(self) -> bool:
        return self.fits_alone and (self.rollout_workers is None or self.rollout_workers.fits)

    @property
    def margin(self) -> float:
        """GiB between the peak and what the workers may use (the device less its reserve):
        what a planner error may eat before the run stops fitting (negative: over)."""
        return self.memory_gib - self.reserve_gib - self.peak


def _gib(n: float) -> float:
    return n / GIB


def host_memory_gib() -> float:
    return meminfo_bytes("MemTotal") / GIB


def plan_layout(cfg: Config, s: Shape, device: str) -> Layout:
    """The Layout the workers of `cfg` would resolve on `device` ("gpu" or "cpu") for a model of
    shape `s`: the same `resolve` they call, on the config it was read from (no model is built,
    so an output layer only a built model shows as not plain is not seen here)."""
    t = cfg.trainer
    return resolve(cfg, s.config, "cuda" if device == "gpu" else "cpu", t.nnodes * t.workers_per_node,
                   get_rollout(cfg.rollout.backend))


def estimate(cfg: Config, s: Shape, device: str = "gpu", memory_gib: float = 80.0,
             genrm: Shape | None = None, host_memory_gib: float = HOST_MEMORY_GIB) -> Estimate:
    """Per-worker memory of `cfg` for a model of shape `s` (`genrm`: a GenRM the run starts itself
    with the hf backend, on the first GPU; `host_memory_gib`: a GPU node's host memory for what
    trainer.offload puts there)."""
    layout = plan_layout(cfg, s, device)
    gpu, world, mode = device == "gpu", layout.world, layout.sharding
    b = dtype_bytes(layout.weight_dtype)  # master weights, their gradients and Adam states
    c = dtype_bytes(layout.compute_dtype)
    flash = layout.attention.startswith("flash") and layout.sequence_parallel == 1  # Ulysses: sdpa per sequence
    est = Estimate(device, world, memory_gib, GPU_RESERVE_GIB if gpu else 0.0, layout=layout,
                   workers_per_node=cfg.trainer.workers_per_node, host_memory_gib=host_memory_gib)
    algo = get_algo(cfg.algo)
    zl = cfg.flowrl.zhead_layers if algo.zhead else 0
    lm, pol = s.params, s.params + zhead_params(s.hidden, zl)
    share = 1 / world if mode == "fsdp" else 1.0
    add = est.terms.append

    if not gpu:
        add(_baseline())
    states = [Term("policy parameters", _gib(pol * b * share), _gib(pol * b * share),
                   f"{pol / 1e9:.3g} B params x {b} B" + (f" / {world} (FSDP2)" if share < 1 else ""), "states"),
              Term("gradients", 0, _gib(pol * b * share), "freed after the step (set_to_none)", "states"),
              Term("AdamW states (2)", _gib(2 * pol * b * share), _gib(2 * pol * b * share),
                   "fused AdamW, weights' dtype", "states")]
    if layout.offload and gpu:  # FSDP2's CPU offload: the shards and the step are the host's
        est.host = [Term(t.name, t.rollout, t.update, t.note + ", in host memory (trainer.offload)") for t in states]
    else:
        est.terms += states
    if mode == "replicate":
        add(Term("DDP gradient buckets", 0, _gib(pol * b), "a second copy of the gradients, all-reduced"))
    if mode == "fsdp":
        root = s.root_params + zhead_params(s.hidden, zl)
        add(Term("FSDP2 root, gathered", 0, _gib(2 * root * c),
                 "embeddings, norm, LM head (+ Z-head) and their gradient, forward to end of backward"))
        add(Term("FSDP2 layers, gathered", 0, _gib(s.layer_params * (3 * c + (4 if c == 2 else 0))),
                 "2 layers prefetched + one layer's gradient (fp32 for its reduce-scatter)"))
    if algo.needs_ref(cfg):
        ref = lm * c * share  # the worker reshards its root after its pass (it never runs a backward)
        (est.host if layout.offload and gpu else est.terms).append(
            Term("reference model", _gib(ref), _gib(ref), "frozen, held like the policy in the compute dtype"))

    # the update's forward
    f = forward_tokens(cfg, layout)
    ckpt = cfg.model.gradient_checkpointing
    rows = f"packed {f.tokens} tokens" if layout.packed else f"{f.rows} rows x {f.tokens // f.rows}"
    if layout.sequence_parallel > 1:
        rows += f" (a row's 1/{layout.sequence_parallel}, Ulysses)"
    add(Term("activations", 0, _gib(activation_bytes(s, f, c, ckpt, flash)),
             f"{rows}; checkpointing {'on' if ckpt else 'off'}; "
             + ("flash-attn" if flash else "sdpa per sequence, no mask" if layout.sequence_parallel > 1
                else f"sdpa, {f.mask / 1e6:.3g} M-element mask"), "activations"))
    if layout.sequence_parallel > 1:
        add(Term("Ulysses all-to-all", 0, _gib(all_to_all_bytes(s, f, c, layout.sequence_parallel)),
                 "one layer's q, k, v and output, sent and received"))
    add(Term("logits", 0, _gib(logits_bytes(s, f, c, layout.fused, gpu)),
             f"{'fused: one vocabulary chunk' if layout.fused else f'unfused: {f.logit_rows} x {s.vocab}'}", "logits"))

    # the rollout engine: what its spec counts (rollout/registry.py `EngineSpec.memory`), on the
    # trainer's workers or, split, on the rollout workers'
    mem = get_rollout(cfg.rollout.backend).memory(cfg, s, layout, memory_gib * GIB)
    engine = [Term(t.name, _gib(t.rollout), _gib(t.update), t.note, t.knob) for t in mem.terms]
    eb, seq = dtype_bytes(layout.rollout_dtype), cfg.max_sequence
    if cfg.trainer.placement == "split":
        est.phases = ("publish", "update")
        est.rollout_workers = _rollout_role(cfg, s, layout, mem, engine, memory_gib)
        # every trainer rank takes part in gathering each bucket that rank 0 sends
        add(Term("weight publish buckets", _gib(publish_bytes(s, lm, eb)), 0,
                 f"one bucket gathered in {layout.rollout_dtype} and sent as it is, or the largest parameter "
                 f"alone"))
    else:
        est.problems += mem.problems
        est.engine_sequences = mem.sequences
        est.terms += engine
        if mode == "fsdp":  # every engine takes its weights from the shards, gathered a bucket at a time
            add(Term("weight sync buckets", _gib(sync_bytes(s, lm, eb, world)), 0,
                     f"one bucket gathered in {layout.rollout_dtype} + its full tensors, or the largest "
                     f"parameter alone"))
    if genrm is not None and gpu:
        g = _gib(genrm.params * 2 + kv_bytes(genrm, DEFAULT_MAX_BATCH, seq + cfg.fapo.genrm.max_tokens, 2))
        add(Term("GenRM (hf, on the first GPU)", g, g, f"bf16 weights + KV of {DEFAULT_MAX_BATCH} verdicts"))

    # The setup is no phase of its own: the worker shards from host memory (fully_shard moves one
    # unit at a time to the device, trainer/worker.py), so beside the engine it holds the shards
    # and one unit's full weights, less than the rollout phase's shards and AdamW states.
    if gpu:  # flash-attn or sdpa: as installed where this runs (pip install 'reasonrl_fast[gpu]' on the workers)
        est.notes.append(f"{layout.notes['attention']}, as installed here")
    else:
        est.notes.append("CPU: a worker's max RSS; the GenRM and the reward workers live in other processes")
    return est


def _baseline() -> Term:
    """A CPU worker's process before any model (CPU_BASELINE_GIB)."""
    return Term("process baseline", CPU_BASELINE_GIB, CPU_BASELINE_GIB, "python, torch, transformers, Ray worker")


def _rollout_role(cfg: Config, s: Shape, layout: Layout, mem, engine: list[Term], memory_gib: float) -> Estimate:
    """Split placement: one rollout worker (one rank of an engine over rollout.tensor_parallel_size
    workers), which holds the engine alone and receives each published version a bucket at a time
    (rollout/transport.py), generating on while it does."""
    gpu = layout.device == "cuda"
    role = Estimate("gpu" if gpu else "cpu", cfg.rollout.workers * layout.engine_tp, memory_gib,
                    GPU_RESERVE_GIB if gpu else 0.0, layout=layout, engine_sequences=mem.sequences,
                    problems=list(mem.problems), phases=("generate", "receive"))
    if not gpu:
        role.terms.append(_baseline())
    role.terms += engine
    role.terms.append(Term("weight receive buckets", 0, _gib(sync_bytes(s, s.params, dtype_bytes(layout.rollout_dtype),
                                                                     1)),
                           f"one bucket received in {layout.rollout_dtype} and loaded, or the largest parameter "
                           f"alone"))
    return role


def kv_budget_problem(cfg: Config, s: Shape, layout: Layout) -> str | None:
    """What stops the rollout engine of `layout` starting with these settings (its spec's
    `start_problem`: a KV cache too small for one full-length sequence), else None. The planner
    and the trainer's preflight both ask."""
    return get_rollout(cfg.rollout.backend).start_problem(cfg, s, layout)


# ---------------------------------------------------------------- advice


def advise(cfg: Config, s: Shape, est: Estimate, device: str, genrm: Shape | None) -> list[str]:
    """The first knob to turn: for the largest reducible term of the phase over the limit, the
    setting (with the value) that makes the estimate fit, where one does."""
    if est.fits:
        return []
    out, role = [], est.rollout_workers
    if role is not None and not role.fits:  # split placement: the rollout workers' own
        out += role.problems
        if role.peak > role.memory_gib - role.reserve_gib:
            big = max(role.terms, key=lambda t: max(t.rollout, t.update))
            out.append(f"the rollout workers' largest term is {big.name}: lower rollout.kv_cache_memory_bytes or "
                       f"rollout.gpu_memory_utilization, or raise rollout.tensor_parallel_size")
    limit = est.memory_gib - est.reserve_gib
    out += est.problems
    if est.peak <= limit:
        if est.host_per_node > est.host_memory_gib:  # offloaded states beyond the nodes' host memory
            return out + [smallest_fit(cfg, s, est, device, genrm)
                          or f"the offloaded states take {est.host_per_node:.0f} GiB of a node's host memory: "
                             f"more than --host-memory-gb {est.host_memory_gib:g}"]
        return out

    fits_with = functools.partial(_fits_with, cfg, s, est, device, genrm)
    phase = est.phase
    terms = sorted(est.terms, key=lambda x: -(x.update if phase == "update" else x.rollout))
    seq = cfg.max_sequence
    for term in terms:
        if term.knob == "activations" and phase == "update":
            if not cfg.model.gradient_checkpointing and fits_with(model__gradient_checkpointing=True):
                return out + ["set model.gradient_checkpointing=true"]
            for ckpt in (cfg.model.gradient_checkpointing, True):
                best = 0
                for m in range(seq, 1 << 22, max(1024, seq)):  # the largest budget that fits
                    if not fits_with(optim__micro_batch_tokens=m, model__gradient_checkpointing=ckpt):
                        break
                    best = m
                if best and (not cfg.optim.micro_batch_tokens or best < cfg.optim.micro_batch_tokens):
                    extra = "" if ckpt == cfg.model.gradient_checkpointing else " and model.gradient_checkpointing=true"
                    return out + [f"set optim.micro_batch_tokens={best}{extra}"]
        elif term.knob == "logits" and phase == "update" and cfg.model.fused_lm_head != "true":
            if fits_with(model__fused_lm_head="true"):
                return out + ["set model.fused_lm_head=true"]
        elif term.knob == "engine" and phase == "rollout":
            if est.layout.kv_cache_bytes is not None and cfg.rollout.kv_cache_memory_bytes is not None:
                kv = cfg.rollout.kv_cache_memory_bytes - int((est.rollout - limit) * GIB) - 2 ** 20
                if kv > 0 and fits_with(rollout__kv_cache_memory_bytes=kv):
                    return out + [f"lower rollout.kv_cache_memory_bytes to {kv}"]
            elif est.layout.engine_share is not None:
                over = est.rollout - limit
                util = est.layout.engine_share - over / est.memory_gib
                if fits_with(rollout__gpu_memory_utilization=round(util - 0.005, 2)):
                    return out + [f"lower rollout.gpu_memory_utilization to {util - 0.005:.2f}"]
            # an engine too large for one GPU beside the trainer: 1/TP of its weights on each
            choice = tensor_parallel_choice(cfg, s, est, device, genrm)
            if choice is not None:
                return out + [choice.setting]
        elif term.knob == "states":
            break  # the sharded states: more GPUs, offload, or both, below
    return out + [smallest_fit(cfg, s, est, device, genrm)
                  or f"no single knob fits it: the largest {phase} term is {terms[0].name}"]


def _fits_with(cfg: Config, s: Shape, est: Estimate, device: str, genrm: Shape | None, **changes) -> bool:
    """Whether the workers of `est`'s table fit with `changes` (section__name=value; split
    placement: the trainer workers), False where the changed settings cannot be had."""
    c2 = copy.deepcopy(cfg)
    for key, v in changes.items():
        section, name = key.split("__")
        setattr(getattr(c2, section), name, v)
    try:
        return estimate(c2, s, device, est.memory_gib, genrm, est.host_memory_gib).fits_alone
    except ConfigError:  # a sequence-parallel size the heads refuse, say
        return False


def smallest_fit(cfg: Config, s: Shape, est: Estimate, device: str, genrm: Shape | None) -> str | None:
    """The fewest GPUs at which the trainer workers fit (the run's count, else GPU_COUNTS), each
    count tried as it is, then with the fewest of trainer.offload and the smallest Ulysses
    sequence_parallel_size (SEQUENCE_PARALLEL_SIZES, dividing the count and the heads): the
    setting, or None where nothing up to 512 GPUs fits. A rollout engine's TP must divide a node's
    GPUs, and offload needs host memory for the shards (`host_memory_gib` per node)."""
    if device != "gpu":
        return None
    t = cfg.trainer
    offloads = [t.offload] + ([OFFLOAD] if t.offload == "none" else [])
    sps = [t.sequence_parallel_size] + [x for x in SEQUENCE_PARALLEL_SIZES if x > t.sequence_parallel_size]
    tries = sorted(((off != t.offload) + (sp != t.sequence_parallel_size), sp, off) for off in offloads for sp in sps)
    for n in [est.world] + [g for g in GPU_COUNTS if g > est.world]:
        per_node = min(8, n) if n != est.world else t.workers_per_node
        if per_node % cfg.rollout.tensor_parallel_size:
            continue
        for _, sp, off in tries:
            if n % sp or not _fits_with(cfg, s, est, device, genrm, trainer__nnodes=n // per_node,
                                        trainer__workers_per_node=per_node, trainer__offload=off,
                                        trainer__sequence_parallel_size=sp):
                continue
            changes = ([f"trainer.offload={off}"] if off != t.offload else []) + (
                [f"trainer.sequence_parallel_size={sp}"] if sp != t.sequence_parallel_size else [])
            if n == est.world:
                return "set " + " and ".join(changes)
            return f"more GPUs: --gpus {n}" + (" with " + " and ".join(changes) if changes else "") + " fits"
    return None


def sequences_wanted(cfg: Config) -> int:
    """Full-length sequences an engine of `cfg` should hold in flight: MIN_SEQUENCES_IN_FLIGHT, or
    its whole batch (its TP workers' prompts x rollout.n) where that is fewer."""
    return min(MIN_SEQUENCES_IN_FLIGHT, rollout_sequences(cfg))


@dataclass(frozen=True)
class TensorParallelChoice:
    tp: int
    util: float | None  # rollout.gpu_memory_utilization to set with it; None: the config's
    est: Estimate  # the estimate with both set
    changes: tuple[str, ...]  # the settings, key=value

    @property
    def setting(self) -> str:
        return "set " + " and ".join(self.changes)


def tensor_parallel_choice(cfg: Config, s: Shape, est: Estimate, device: str,
                           genrm: Shape | None) -> TensorParallelChoice | None:
    """The smallest rollout.tensor_parallel_size in TENSOR_PARALLEL_SIZES that the run can have (it
    divides trainer.workers_per_node, and the model's heads and MLP as layout/
    `tensor_parallel` checks) with which one engine holds `sequences_wanted` full-length sequences
    and the whole estimate fits: at the config's rollout.gpu_memory_utilization where that does,
    else at the largest share that fits (to two decimals). None where no size does, or the engine
    cannot shard the model (the hf backend)."""
    if device != "gpu" or est.engine_sequences is None or not get_rollout(cfg.rollout.backend).tensor_parallel:
        return None
    limit = est.memory_gib - est.reserve_gib
    for tp in TENSOR_PARALLEL_SIZES:
        if cfg.trainer.workers_per_node % tp:
            continue
        c2 = copy.deepcopy(cfg)
        c2.rollout.tensor_parallel_size = tp
        try:
            tensor_parallel(c2, s.config)
        except ConfigError:
            continue
        e2 = estimate(c2, s, device, est.memory_gib, genrm, est.host_memory_gib)
        utils = [None]
        if e2.layout.engine_share is not None and e2.update <= limit:
            # the engine's share is its whole rollout term: the rest of the rollout phase stays
            best = math.floor((e2.layout.engine_share + (limit - e2.rollout) / est.memory_gib) * 100) / 100
            if 0 < best <= 1 and best != e2.layout.engine_share:
                utils.append(best)
        for util in utils:
            if util is not None:
                c2.rollout.gpu_memory_utilization = util
                e2 = estimate(c2, s, device, est.memory_gib, genrm, est.host_memory_gib)
            if e2.fits and e2.engine_sequences >= sequences_wanted(c2):
                changes = ((f"rollout.tensor_parallel_size={tp}",) if tp != cfg.rollout.tensor_parallel_size else ()
                           ) + ((f"rollout.gpu_memory_utilization={util:.2f}",) if util is not None else ())
                return TensorParallelChoice(tp, util, e2, changes)
    return None


def rollout_advice(cfg: Config, s: Shape, est: Estimate, device: str, genrm: Shape | None) -> str | None:
    """For an engine on a GPU with room for fewer than `sequences_wanted` full-length sequences (a
    rollout run a few sequences at a time, whether or not the run fits): the tensor-parallel size
    (and engine share) that gives them, or why none does. None where the engine has the room."""
    if device != "gpu" or est.engine_sequences is None or est.engine_sequences >= sequences_wanted(cfg):
        return None
    if not get_rollout(cfg.rollout.backend).tensor_parallel:
        return None
    seq = cfg.max_sequence
    why = (f"the rollout engine has room for {est.engine_sequences:.1f} of its {rollout_sequences(cfg)} sequences "
           f"of {seq} tokens at once (wanted: {sequences_wanted(cfg)})")
    choice = tensor_parallel_choice(cfg, s, est, device, genrm)
    if choice is None:
        return (f"{why}; no rollout.tensor_parallel_size in {TENSOR_PARALLEL_SIZES} that divides "
                f"trainer.workers_per_node={cfg.trainer.workers_per_node} and the model's heads gives that and fits")
    c2 = copy.deepcopy(cfg)
    c2.rollout.tensor_parallel_size = choice.tp
    return (f"{choice.setting}: {why}; with it room for {choice.est.engine_sequences:.1f} of its "
            f"{rollout_sequences(c2)}, peak {choice.est.peak:.2f} GiB: fits")


# ---------------------------------------------------------------- the command


def render(est: Estimate) -> str:
    """The table of `est` (split placement: the trainer workers' and the rollout workers')."""
    lines = _table(est, "trainer workers, each" if est.rollout_workers else "")
    if est.rollout_workers:
        role = est.rollout_workers
        lines += [""] + _table(role, f"rollout workers ({_engines(role)}), each")
    return "\n".join(lines + est.notes)


def _engines(role: Estimate) -> str:
    tp = role.layout.engine_tp
    return f"{role.world // tp} engine{'s' if role.world // tp > 1 else ''} of TP {tp}"


def _table(est: Estimate, title: str) -> list[str]:
    w = max(len(t.name) for t in est.terms) + 2
    a, b = est.phases
    lines = [title + ":"] if title else []
    lines += [f"{'term':<{w}}{a:>9}{b:>9}  note", "-" * (w + 60)]
    for t in est.terms:
        lines.append(f"{t.name:<{w}}{t.rollout:>9.2f}{t.update:>9.2f}  {t.note}")
    lines.append("-" * (w + 60))
    lines.append(f"{'total (GiB)':<{w}}{est.rollout:>9.2f}{est.update:>9.2f}")
    where = (f"of {est.memory_gib:g} GiB per GPU, less a {est.reserve_gib:g} GiB reserve" if est.device == "gpu"
             else f"of {est.memory_gib:.1f} GiB of host memory per worker")
    margin = (f", {est.margin:.2f} GiB to spare" if est.margin >= 0 else f", {-est.margin:.2f} GiB over")
    lines.append(f"peak: {est.peak:.2f} GiB in the {est.phase} phase, {where}: "
                 + ("fits" if est.fits_device else "does NOT fit") + margin)
    if est.host:
        room = est.host_memory_gib - est.host_per_node
        lines.append(f"host memory (trainer.offload): {est.host_each:.2f} GiB per worker ("
                     + ", ".join(t.name for t in est.host) + f"), {est.host_per_node:.1f} GiB for the node's "
                     f"{est.workers_per_node}, of {est.host_memory_gib:g} GiB (--host-memory-gb): "
                     + (f"fits, {room:.1f} GiB to spare" if room >= 0 else f"does NOT fit, {-room:.1f} GiB over"))
    return lines


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line through cli.main, not argparse's usage block
        raise ConfigError(f"plan: {message}")


def gpu_overrides(value: str) -> list[str]:
    """--gpus N as the trainer's node and worker counts: up to 8 on one node, else nodes of 8."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1 or (n > 8 and n % 8):
        raise ConfigError(f"--gpus {value}: expected 1 to 8 (one node) or a multiple of 8 (nodes of 8 GPUs)")
    return [f"trainer.nnodes={max(1, n // 8)}", f"trainer.workers_per_node={min(n, 8)}"]


def gpu_memory(value: str, flag: str = "--gpu-memory-gb") -> float:
    """--gpu-memory-gb (or --host-memory-gb) as a number: finite (inf would fit anything, nan
    nothing) and above 0."""
    try:
        gib = float(value)
    except ValueError:
        gib = math.nan
    if not (math.isfinite(gib) and gib > 0):
        example = "80 for an 80 GB card" if flag == "--gpu-memory-gb" else "1024 for a node of 1 TiB"
        raise ConfigError(f"{flag} {value}: expected a finite number of GiB above 0 ({example})")
    return gib


def main(argv: list[str] | None = None) -> Estimate:
    return cli.main(_main, argv)


def _main(argv: list[str]) -> Estimate:
    p = _Parser(prog="python -m reasonrl_fast.plan", description=__doc__.splitlines()[2])
    p.add_argument("args", nargs="*", help="[CONFIG.yaml] key=value ...")
    p.add_argument("--gpus", help="GPUs in all (sets trainer.nnodes and trainer.workers_per_node)")
    p.add_argument("--gpu-memory-gb", help="memory per GPU in GiB (default 80)")
    p.add_argument("--host-memory-gb", help=f"host memory per GPU node in GiB that trainer.offload may fill "
                                             f"(default {HOST_MEMORY_GIB:g})")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    a = p.parse_intermixed_args(argv)  # key=value settings before, between or after the flags
    given_mem = gpu_memory(a.gpu_memory_gb) if a.gpu_memory_gb is not None else None
    host = gpu_memory(a.host_memory_gb, "--host-memory-gb") if a.host_memory_gb is not None else HOST_MEMORY_GIB
    cfg = load_argv(a.args + (gpu_overrides(a.gpus) if a.gpus is not None else []))
    # the contexts are read as the trainer's preflight reads them (layout/shape.py); a run past
    # one is flagged as a problem: it would not start
    problems = []
    if not cfg.embedded_model:
        d, where, note = model_fields(cfg.model.path, f"model.path={cfg.model.path!r}")
        if note:
            print(note)
        s = shape_from_config(d, where)
        problems.append(context_problem(cfg, d, where))
    else:
        from reasonrl_fast.models.tiny import TINY_SOURCE

        s = tiny_shape(cfg.model)  # checked as the trainer's preflight checks it
        problems.append(context_problem(cfg, s.config, TINY_SOURCE))
    genrm = None
    g = cfg.fapo.genrm
    if get_algo(cfg.algo).uses_genrm and g.local_model is not None:
        d, where, note = model_fields(g.local_model, f"fapo.genrm.serve={g.serve!r}")
        if note:
            print(note)
        genrm = shape_from_config(d, where)
        problems.append(genrm_context_problem(cfg, d, where))
    # on CPU the host's memory is shared by every worker of the node (split: the rollout workers too)
    workers = cfg.trainer.workers_per_node + (cfg.rollout.workers * cfg.rollout.tensor_parallel_size
                                              if cfg.trainer.placement == "split" else 0)
    mem = given_mem if given_mem is not None else (80.0 if a.device == "gpu" else host_memory_gib() / workers)
    if mem <= 0:  # --device cpu on a machine whose /proc/meminfo cannot be read
        raise ConfigError("the host's memory is unknown (no /proc/meminfo): give --gpu-memory-gb")
    est = estimate(cfg, s, a.device, mem, genrm, host)
    est.problems += [p for p in problems if p]
    unit = "GPU" if a.device == "gpu" else "CPU worker"
    on = f"{est.world} {unit}{'s' if est.world > 1 else ''}"
    if est.rollout_workers:
        n = est.rollout_workers.world
        on = f"{on} (trainer) + {n} {unit}{'s' if n > 1 else ''} (rollout), split placement"
    print(f"{cfg.algo} on {on}, model {cfg.model.path or 'embedded tiny'} ({s.params / 1e9:.3g} B params)")
    print(render(est))
    for line in advise(cfg, s, est, a.device, genrm):
        print(f"to fit: {line}")
    tip = rollout_advice(cfg, s, est, a.device, genrm)
    if tip:
        print(f"to speed up: {tip}")
    return est


if __name__ == "__main__":
    sys.exit(0 if main().fits else 1)
