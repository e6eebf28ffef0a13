"""`python -m reasonrl_fast.plan CONFIG [key=value ...] [--gpus N] [--gpu-memory-gb 80] [--device gpu|cpu]`

The memory one worker (one GPU, or one CPU process) of a training run needs, term by term, in
the two phases of a step: the rollout (the engine generating) and the update (log-prob passes,
forward and backward, optimiser step). It reads the model's config.json only, never weights: from
`model.path`, else the shipped shape of a model the configs name (`plan_shapes.py`). Exit status
0 when the peak fits the device, 1 when it does not (with the first knob to turn), 2 on bad input.
docs/scaling.md explains every row and the knobs.

The estimate is an upper bound of the worst step: every sequence at data.max_prompt_length +
rollout.max_new_tokens. On CPU it is what the worker's `memory/peak_gb` (its max RSS) measures,
checked against real runs by tests/test_plan.py."""

from __future__ import annotations

import argparse
import copy
import math
import sys
from dataclasses import dataclass, field

from reasonrl_fast import cli
from reasonrl_fast.config import Config, load_config
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.models.shape import check_shape, context_problem, genrm_context_problem, model_fields
from reasonrl_fast.util import meminfo_bytes, rollout_sequences, shares

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
# vLLM needs beyond its weights and KV cache: the activations of its profiling batch, the
# sampler's logits and CUDA graphs (about 1-2 GiB for 4-32B models at the default batch limits).
VLLM_OVERHEAD_GIB = 2.0
SYNC_BUCKET = 256 * 2 ** 20  # trainer/fsdp.py iter_full's bucket of full tensors
GENRM_MAX_BATCH = 64  # genrm/hf_backend.py's default batch of verdicts


# ---------------------------------------------------------------- the model's shape


@dataclass(frozen=True)
class Shape:
    """What the estimate reads of a decoder-only (Llama-family) model's config.json."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    model_type: str
    attn_bias: bool  # q/k/v biases (Qwen2; attention_bias elsewhere)
    qk_norm: bool  # RMSNorm on q and k per head (Qwen3)
    sliding: bool = False
    o_bias: bool = False  # o_proj's bias (attention_bias in Llama, Mistral, Qwen3; never Qwen2)
    mlp_bias: bool = False

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = 2 * h * q + 2 * h * kv + ((q + 2 * kv) if self.attn_bias else 0) + (h if self.o_bias else 0)
        qk = 2 * self.head_dim if self.qk_norm else 0
        mlp = 3 * h * self.intermediate + ((2 * self.intermediate + h) if self.mlp_bias else 0)
        return attn + qk + mlp + 2 * h  # + the two RMSNorms

    @property
    def root_params(self) -> int:
        """Embeddings, final norm and LM head: FSDP2's root unit."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params


def shape_from_config(d: dict, where: str) -> Shape:
    """A Shape from config.json's fields (a multimodal config's text_config when it has one),
    after the trainer's own shape check (models/shape.py `check_shape`)."""
    if "hidden_size" not in d and isinstance(d.get("text_config"), dict):
        d = {**d["text_config"], "tie_word_embeddings": d.get("tie_word_embeddings", False)}
    check_shape(d, where)
    mt = d.get("model_type", "")
    heads = d["num_attention_heads"]
    return Shape(hidden=d["hidden_size"], intermediate=d["intermediate_size"], layers=d["num_hidden_layers"],
                 heads=heads, kv_heads=d.get("num_key_value_heads") or heads,
                 head_dim=d.get("head_dim") or d["hidden_size"] // heads, vocab=d["vocab_size"],
                 tied=bool(d.get("tie_word_embeddings", False)), model_type=mt,
                 attn_bias=mt == "qwen2" or bool(d.get("attention_bias")), qk_norm=mt == "qwen3",
                 o_bias=mt != "qwen2" and bool(d.get("attention_bias")), mlp_bias=bool(d.get("mlp_bias")),
                 sliding=bool(d.get("use_sliding_window")) or (mt == "mistral" and bool(d.get("sliding_window"))))


def tiny_shape(m) -> Shape:
    """The embedded tiny model of models/tiny.py, from the config's model section."""
    from reasonrl_fast.models.tiny import char_tokenizer

    return Shape(hidden=m.hidden_size, intermediate=m.intermediate_size, layers=m.num_layers, heads=m.num_heads,
                 kv_heads=max(1, m.num_heads // 2), head_dim=m.hidden_size // m.num_heads,
                 vocab=len(char_tokenizer()), tied=False, model_type="qwen2", attn_bias=True, qk_norm=False)


def zhead_params(hidden: int, layers: int) -> int:
    """ops/zhead.py: (layers - 1) x [Linear(H, H), LayerNorm(H)] + Linear(H, 1)."""
    return (layers - 1) * (hidden * hidden + 3 * hidden) + hidden + 1 if layers else 0


# ---------------------------------------------------------------- one forward's tokens


@dataclass(frozen=True)
class Forward:
    rows: int  # rows of one forward (packed: sequences' worth of rows)
    tokens: int  # positions the layers see (flash-attn packed: real tokens; else rows x longest)
    logit_rows: int  # positions whose next token is a response token (the head's rows)
    mask: int  # elements of the attention mask sdpa reads (0 with flash-attn)


def forward_tokens(cfg: Config, world: int, packed: bool, flash: bool) -> Forward:
    """The worst forward of the update: the largest mini-batch of the largest worker's share, or a
    micro-batch of optim.micro_batch_tokens, every sequence at its longest."""
    from reasonrl_fast.trainer.policy import mini_batches

    p, r = cfg.data.max_prompt_length, cfg.rollout.max_new_tokens
    seq = p + r
    most = len(shares(cfg.data.prompts_per_step, world)[0])
    rows = max(s.stop - s.start for s in mini_batches(cfg, most))
    budget = cfg.optim.micro_batch_tokens
    if packed:
        tokens = min(max(budget, seq), rows * seq) if budget else rows * seq  # a longer sequence runs alone
        # a packed micro-batch of short prompts holds more responses: at most R of every R + 1 tokens
        logit_rows = min(rows * r, tokens * r // (r + 1))
        if flash:  # one row, flash-attn's variable-length kernels: no mask
            return Forward(-(-tokens // seq), tokens, logit_rows, 0)
        # sdpa: rows as long as the longest sequence (trainer/policy.py make_packed_batch), each with
        # its block-diagonal mask
        packed_rows = -(-tokens // seq)
        return Forward(packed_rows, packed_rows * seq, logit_rows, packed_rows * seq * seq)
    if budget:
        rows = max(1, min(rows, budget // seq))
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
    head's input rows. Fused: one vocabulary chunk of linear_token_logprob's backward (`_chunk`)
    and its float32 dh accumulator."""
    import torch

    from reasonrl_fast.ops.linear_token_logprob import _chunk

    n = f.logit_rows
    if not fused:
        return 2 * n * s.vocab * c + n * s.hidden * c
    width = _chunk(n, s.hidden, s.vocab, torch.device("cuda" if gpu else "cpu"))
    chunk = n * width * c if gpu else 3 * n * (width + 1) * c  # CPU: logits, padded copy, dz
    return chunk + n * s.hidden * (4 + 2 * c)


def kv_bytes(s: Shape, rows: int, length: int, c: int) -> int:
    return 2 * s.layers * rows * s.kv_heads * s.head_dim * length * c


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
        return "update" if self.update >= self.rollout else "rollout"

    @property
    def fits(self) -> bool:
        return not self.problems and self.peak <= self.memory_gib - self.reserve_gib


def _gib(n: float) -> float:
    return n / GIB


def host_memory_gib() -> float:
    return meminfo_bytes("MemTotal") / GIB


def estimate(cfg: Config, s: Shape, device: str = "gpu", memory_gib: float = 80.0,
             genrm: Shape | None = None) -> Estimate:
    """Per-worker memory of `cfg` for a model of shape `s` (`genrm`: a GenRM the run starts itself
    with the hf backend, on the first GPU)."""
    from reasonrl_fast.algos import get_algo
    from reasonrl_fast.models.lm_head import FUSED_CPU_MIN_ELEMENTS
    from reasonrl_fast.models.loading import PACKED_FAMILIES, master_dtype
    import torch

    from reasonrl_fast.trainer.fsdp import compute_dtype, sharding_mode
    from reasonrl_fast.trainer.policy import tokens_per_forward

    gpu = device == "gpu"
    t = cfg.trainer
    world = t.nnodes * t.workers_per_node
    dev = torch.device("cuda" if gpu else "cpu")
    mode = sharding_mode(t.sharding, dev, world)  # the workers' own rules, here and below
    master = master_dtype(cfg.model.dtype)
    b = master.itemsize  # master weights, their gradients and Adam states
    c = compute_dtype(cfg.model.compute_dtype, master, dev, mode).itemsize  # the workers' own rule
    flash = gpu and c == 2  # models/loading.py attention_implementation: flash-attn for bf16 compute on CUDA
    est = Estimate(device, world, memory_gib, GPU_RESERVE_GIB if gpu else 0.0)
    algo = get_algo(cfg.algo)
    zl = cfg.flowrl.zhead_layers if algo.zhead else 0
    lm, pol = s.params, s.params + zhead_params(s.hidden, zl)
    share = 1 / world if mode == "fsdp" else 1.0
    add = est.terms.append

    if not gpu:
        add(Term("process baseline", CPU_BASELINE_GIB, CPU_BASELINE_GIB, "python, torch, transformers, Ray worker"))
    add(Term("policy parameters", _gib(pol * b * share), _gib(pol * b * share),
             f"{pol / 1e9:.3g} B params x {b} B" + (f" / {world} (FSDP2)" if share < 1 else ""), "states"))
    add(Term("gradients", 0, _gib(pol * b * share), "freed after the step (set_to_none)", "states"))
    add(Term("AdamW states (2)", _gib(2 * pol * b * share), _gib(2 * pol * b * share), "fused AdamW, weights' dtype",
             "states"))
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
        add(Term("reference model", _gib(ref), _gib(ref), "frozen, held like the policy in the compute dtype"))

    # the update's forward
    packed = cfg.data.packing == "true" or (cfg.data.packing == "auto" and s.model_type in PACKED_FAMILIES
                                            and not s.sliding)
    f = forward_tokens(cfg, world, packed, flash)
    ckpt = cfg.model.gradient_checkpointing
    fused = cfg.model.fused_lm_head == "true" or (
        cfg.model.fused_lm_head == "auto" and (gpu or tokens_per_forward(cfg, world) * s.vocab >= FUSED_CPU_MIN_ELEMENTS))
    layout = f"packed {f.tokens} tokens" if packed else f"{f.rows} rows x {f.tokens // f.rows}"
    add(Term("activations", 0, _gib(activation_bytes(s, f, c, ckpt, flash)),
             f"{layout}; checkpointing {'on' if ckpt else 'off'}; "
             + ("flash-attn" if flash else f"sdpa, {f.mask / 1e6:.3g} M-element mask"), "activations"))
    add(Term("logits", 0, _gib(logits_bytes(s, f, c, fused, gpu)),
             f"{'fused: one vocabulary chunk' if fused else f'unfused: {f.logit_rows} x {s.vocab}'}", "logits"))

    # the rollout engine
    rows = rollout_sequences(cfg)
    seq = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    eb = 2 if gpu else c  # vLLM's dtype: bf16 on a GPU, on CPU the trainer's compute dtype (rollout/__init__.py)
    if cfg.rollout.backend == "vllm":
        from reasonrl_fast.rollout.vllm import GPU_UTILIZATION, kv_cache_bytes

        set_bytes = cfg.rollout.kv_cache_memory_bytes
        one = kv_bytes(s, 1, seq, eb)  # the KV cache of one full-length sequence
        if set_bytes is not None and set_bytes < one:
            est.problems.append(f"rollout.kv_cache_memory_bytes={set_bytes} holds less than one {seq}-token "
                                f"sequence's KV cache ({one} bytes): vLLM would not start")
        if gpu and set_bytes is None:
            util = cfg.rollout.gpu_memory_utilization or GPU_UTILIZATION
            engine = util * memory_gib
            need = _gib(lm * eb + one) + VLLM_OVERHEAD_GIB
            room = engine - _gib(lm * eb) - VLLM_OVERHEAD_GIB
            tokens = int(room * GIB / kv_bytes(s, 1, 1, eb)) if room > 0 else 0
            add(Term("vLLM engine", engine, 0, f"{util:g} of {memory_gib:g} GiB; KV room ~{tokens} tokens "
                     f"({tokens / seq:.1f} sequences of {seq}); asleep in the update", "engine"))
            if engine < need:
                est.problems.append(f"rollout.gpu_memory_utilization={util:g} gives vLLM {engine:.1f} GiB, but its "
                                    f"weights, one {seq}-token sequence's KV cache and ~{VLLM_OVERHEAD_GIB:g} GiB "
                                    f"of overhead need {need:.1f} GiB: set it to at least "
                                    f"{need / memory_gib + 0.005:.2f}")
        else:  # the KV cache in bytes, as the worker sizes it (rollout/__init__.py make_rollout)
            kv = kv_cache_bytes(cfg, (s.layers, s.kv_heads, s.head_dim), eb)
            what = ("rollout.kv_cache_memory_bytes" if set_bytes is not None
                    else f"{rows} sequences x {seq} tokens, in blocks")
            if gpu:
                engine = _gib(lm * eb + kv) + VLLM_OVERHEAD_GIB
                add(Term("vLLM engine", engine, 0, f"weights + {_gib(kv):.2f} GiB KV cache ({what}) + "
                         f"~{VLLM_OVERHEAD_GIB:g} GiB; asleep in the update", "engine"))
            else:
                engine = _gib(lm * eb + kv)
                add(Term("vLLM engine", engine, engine, f"weights + {_gib(kv):.3g} GiB KV cache ({what}); "
                         f"no sleep on CPU", "engine"))
        if mode == "fsdp":
            add(Term("weight sync buckets", _gib(2 * SYNC_BUCKET), 0, "one bucket gathered + its full tensors"))
    else:
        kv = kv_bytes(s, rows, seq, c) + rows * s.vocab * 40  # + the sampler's fp32 logits, fp64 noise, int64 hashes
        add(Term("HF rollout copy", _gib(lm * c), _gib(lm * c), "full weights in the compute dtype, refreshed every sync"))
        add(Term("HF rollout KV cache", _gib(kv), 0, f"{rows} rows x {seq} tokens", "engine"))
    if genrm is not None and gpu:
        g = _gib(genrm.params * 2 + kv_bytes(genrm, GENRM_MAX_BATCH, seq + cfg.fapo.genrm.max_tokens, 2))
        add(Term("GenRM (hf, on the first GPU)", g, g, f"bf16 weights + KV of {GENRM_MAX_BATCH} verdicts"))

    # The setup is no phase of its own: the worker shards from host memory (fully_shard moves one
    # unit at a time to the device, trainer/worker.py), so beside the engine it holds the shards
    # and one unit's full weights, less than the rollout phase's shards and AdamW states.
    if not gpu:
        est.notes.append("CPU: a worker's max RSS; the GenRM and the reward workers live in other processes")
    return est


# ---------------------------------------------------------------- advice


def advise(cfg: Config, s: Shape, est: Estimate, device: str, genrm: Shape | None) -> list[str]:
    """The first knob to turn: for the largest reducible term of the phase over the limit, the
    setting (with the value) that makes the estimate fit, where one does."""
    if est.fits:
        return []
    limit = est.memory_gib - est.reserve_gib
    out = [p for p in est.problems]
    if est.problems and est.peak <= limit:
        return out

    def fits_with(**changes) -> Estimate:
        c2 = copy.deepcopy(cfg)
        for key, v in changes.items():
            section, name = key.split("__")
            setattr(getattr(c2, section), name, v)
        return estimate(c2, s, device, est.memory_gib, genrm)

    phase = est.phase
    terms = sorted(est.terms, key=lambda x: -(x.update if phase == "update" else x.rollout))
    seq = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    for term in terms:
        if term.knob == "activations" and phase == "update":
            if not cfg.model.gradient_checkpointing and fits_with(model__gradient_checkpointing=True).fits:
                return out + ["set model.gradient_checkpointing=true"]
            for ckpt in (cfg.model.gradient_checkpointing, True):
                best = 0
                for m in range(seq, 1 << 22, max(1024, seq)):  # the largest budget that fits
                    if not fits_with(optim__micro_batch_tokens=m, model__gradient_checkpointing=ckpt).fits:
                        break
                    best = m
                if best and (not cfg.optim.micro_batch_tokens or best < cfg.optim.micro_batch_tokens):
                    extra = "" if ckpt == cfg.model.gradient_checkpointing else " and model.gradient_checkpointing=true"
                    return out + [f"set optim.micro_batch_tokens={best}{extra}"]
        elif term.knob == "logits" and phase == "update" and cfg.model.fused_lm_head != "true":
            if fits_with(model__fused_lm_head="true").fits:
                return out + ["set model.fused_lm_head=true"]
        elif (term.knob == "engine" and phase == "rollout" and cfg.rollout.backend == "vllm"
              and cfg.rollout.kv_cache_memory_bytes is not None):
            kv = cfg.rollout.kv_cache_memory_bytes - int((est.rollout - limit) * GIB) - 2 ** 20
            if kv > 0 and fits_with(rollout__kv_cache_memory_bytes=kv).fits:
                return out + [f"lower rollout.kv_cache_memory_bytes to {kv}"]
        elif term.knob == "engine" and phase == "rollout" and cfg.rollout.backend == "vllm" and device == "gpu":
            from reasonrl_fast.rollout.vllm import GPU_UTILIZATION

            over = est.rollout - limit
            util = (cfg.rollout.gpu_memory_utilization or GPU_UTILIZATION) - over / est.memory_gib
            if fits_with(rollout__gpu_memory_utilization=round(util - 0.005, 2)).fits:
                return out + [f"lower rollout.gpu_memory_utilization to {util - 0.005:.2f}"]
        elif term.knob == "states":
            gpus = next((n for n in (8, 16, 32, 64, 128, 256, 512) if n > est.world
                         and fits_with(trainer__nnodes=max(1, n // 8), trainer__workers_per_node=min(8, n)).fits), None)
            if gpus:
                return out + [f"more GPUs: --gpus {gpus} fits"]
    return out + [f"no single knob fits it: the largest {phase} term is {terms[0].name}"]


# ---------------------------------------------------------------- the command


def render(est: Estimate) -> str:
    w = max(len(t.name) for t in est.terms) + 2
    lines = [f"{'term':<{w}}{'rollout':>9}{'update':>9}  note", "-" * (w + 60)]
    for t in est.terms:
        lines.append(f"{t.name:<{w}}{t.rollout:>9.2f}{t.update:>9.2f}  {t.note}")
    lines.append("-" * (w + 60))
    lines.append(f"{'total (GiB)':<{w}}{est.rollout:>9.2f}{est.update:>9.2f}")
    where = (f"of {est.memory_gib:g} GiB per GPU, less a {est.reserve_gib:g} GiB reserve" if est.device == "gpu"
             else f"of {est.memory_gib:.1f} GiB of host memory per worker")
    lines.append(f"peak: {est.peak:.2f} GiB in the {est.phase} phase, {where}: "
                 + ("fits" if est.fits else "does NOT fit"))
    return "\n".join(lines + est.notes)


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


def gpu_memory(value: str) -> float:
    """--gpu-memory-gb as a number: finite (inf would fit anything, nan nothing) and above 0."""
    try:
        gib = float(value)
    except ValueError:
        gib = math.nan
    if not (math.isfinite(gib) and gib > 0):
        raise ConfigError(f"--gpu-memory-gb {value}: expected a finite number of GiB above 0 (80 for an 80 GB card)")
    return gib


def main(argv: list[str] | None = None) -> Estimate:
    return cli.main(_main, argv)


def _main(argv: list[str]) -> Estimate:
    p = _Parser(prog="python -m reasonrl_fast.plan", description=__doc__.splitlines()[2])
    p.add_argument("args", nargs="*", help="[CONFIG.yaml] key=value ...")
    p.add_argument("--gpus", help="GPUs in all (sets trainer.nnodes and trainer.workers_per_node)")
    p.add_argument("--gpu-memory-gb", help="memory per GPU in GiB (default 80)")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    a = p.parse_intermixed_args(argv)  # key=value settings before, between or after the flags
    given_mem = gpu_memory(a.gpu_memory_gb) if a.gpu_memory_gb is not None else None
    path = a.args[0] if a.args and "=" not in a.args[0] else None
    overrides = (a.args[1:] if path else a.args) + (gpu_overrides(a.gpus) if a.gpus is not None else [])
    cfg = load_config(path, overrides)
    # the contexts are read as the trainer's preflight reads them (models/shape.py); a run past
    # one is flagged as a problem: it would not start
    problems = []
    if cfg.model.path:
        d, where, note = model_fields(cfg.model.path, f"model.path={cfg.model.path!r}")
        if note:
            print(note)
        s = shape_from_config(d, where)
        problems.append(context_problem(cfg, d, where))
    else:
        from reasonrl_fast.models.tiny import TINY_SOURCE, tiny_config

        check_shape(tiny_config(cfg.model), TINY_SOURCE)  # as the trainer's preflight checks it
        s = tiny_shape(cfg.model)
        problems.append(context_problem(cfg, tiny_config(cfg.model), TINY_SOURCE))
    genrm = None
    g = cfg.fapo.genrm
    if cfg.algo == "fapo" and not g.addresses and g.serve.startswith("hf:"):
        d, where, note = model_fields(g.serve[3:], f"fapo.genrm.serve={g.serve!r}")
        if note:
            print(note)
        genrm = shape_from_config(d, where)
        problems.append(genrm_context_problem(cfg, d, where))
    mem = given_mem if given_mem is not None else (80.0 if a.device == "gpu" else
                                                   host_memory_gib() / cfg.trainer.workers_per_node)
    if mem <= 0:  # --device cpu on a machine whose /proc/meminfo cannot be read
        raise ConfigError("the host's memory is unknown (no /proc/meminfo): give --gpu-memory-gb")
    est = estimate(cfg, s, a.device, mem, genrm)
    est.problems += [p for p in problems if p]
    print(f"{cfg.algo} on {est.world} {'GPU' if a.device == 'gpu' else 'CPU worker'}"
          f"{'s' if est.world > 1 else ''}, model {cfg.model.path or 'embedded tiny'} ({s.params / 1e9:.3g} B params)")
    print(render(est))
    for line in advise(cfg, s, est, a.device, genrm):
        print(f"to fit: {line}")
    return est


if __name__ == "__main__":
    sys.exit(0 if main().fits else 1)
