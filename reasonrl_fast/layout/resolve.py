"""`resolve(cfg, model_config, device, world, spec) -> Layout`: every decision about how a run's
workers hold and run the model, made in one place from the settings, the model's config and the
device. The trainer's workers build from it, eval samples with it, the loop logs its notes and
the memory planner (plan.py) counts bytes from it: none of them restates a rule.

Pure functions of the settings and the model's config (config.json's dict or a transformers
config); the device is a string ("cpu" or "cuda"), dtypes are names ("float32", "bfloat16"),
and nothing here imports torch, so the planner runs where torch is not installed. What only a
built model can tell (an output layer that is not a plain linear layer, docs/trainer.md) comes
in as `head_blocker`, from models/lm_head.py."""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass, field

from reasonrl_fast.errors import ConfigError
from reasonrl_fast.layout.batches import tokens_per_forward
from reasonrl_fast.layout.shape import read, text_part

PACKED_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
"""Model types whose attention reads packed rows from restarting position ids (transformers'
masks for sdpa and eager, flash-attn's variable-length boundaries), checked against the padded
forward in tests/trainer/test_packing.py."""

# CPU only: `auto` fuses when one forward's response tokens x vocabulary reach this (2^27, 512 MiB
# of float32 logits). Read off benchmarks/bench_fused_lm_head.py's measurements of the update's
# forward + backward (benchmarks/RESULTS.md §7): on CPU the fused op was never clearly faster, as
# it forms the logits twice (forward and backward). What it buys is memory, several times less
# peak where the logits are large, for somewhat more time; where they are small it saves nothing
# and costs time. The embedded default (2,048 x 99 = 0.2 M) stays unfused.
FUSED_CPU_MIN_ELEMENTS = 1 << 27

# Config attributes (of the model's config or its text config) that change the logits after
# the head. A value of None, or 1 for the scale factors, leaves them alone.
SOFTCAPS = ("final_logit_softcapping",)  # Gemma 2/3/4, VaultGemma, ...
SCALES = ("logit_scale",         # Cohere, Cohere2
          "logits_scaling",      # Granite family, MiniCPM3, HyperCLOVA X
          "lm_head_multiplier",  # Falcon-H1
          "output_multiplier")

@dataclass(frozen=True)
class Layout:
    """How one worker holds and runs the model (what `resolve` decided)."""

    device: str
    """"cpu" or "cuda"."""
    world: int
    """Trainer workers in all."""
    sharding: str
    """"fsdp" (FSDP2), "replicate" (DDP) or "none" (one worker holds the model whole)."""
    weight_dtype: str
    """The master weights', so their gradients' and AdamW's states' (model.dtype)."""
    compute_dtype: str
    """The forward and backward's; the reference model and an hf sampler's copy are held in it."""
    attention: str
    """transformers' attn_implementation: "sdpa" or "flash_attention_2"."""
    packed: bool
    """The update's forward runs packed rows (data.packing)."""
    one_row: bool
    """Packed into one row per micro-batch (flash-attn's variable-length kernels), else rows as
    long as the micro-batch's longest sequence, each with its block-diagonal mask."""
    fused: bool
    """Log-probs from the fused LM head (model.fused_lm_head)."""
    rollout_dtype: str
    """The rollout engine's weights and compute."""
    kv_cache_bytes: int | None
    """The engine's KV cache in bytes, where it is sized in bytes (else None)."""
    engine_share: float | None
    """The share of the GPU the engine takes, where it is sized by a share (else None)."""
    offload: bool = False
    """The master weights' shards, their gradients and the AdamW states in host memory
    (trainer.offload, FSDP2's CPU offload); the device holds what a forward gathers."""
    sequence_parallel: int = 1
    """Trainer workers that split each packed row (trainer.sequence_parallel_size): one row per
    micro-batch, cut over them, attention through models/ulysses.py."""
    engine_tp: int = 1
    """Workers one rollout engine spans (rollout.tensor_parallel_size): each holds 1/engine_tp of
    its weights and KV cache; `kv_cache_bytes` and `engine_share` are one worker's."""
    engine_sleeps: bool = False
    """The engine gives its device memory to the update (its weights to host memory, its KV cache
    freed): where it shares a GPU with the trainer (colocated placement). A split rollout worker's
    engine has its device to itself and keeps generating through the update."""
    notes: dict = field(default_factory=dict, compare=False)
    """One log line per decision: sharding, attention, packing, lm_head."""

    def to_dict(self) -> dict:
        return asdict(self)


def sharding_mode(setting: str, device: str, world: int, offload: str = "none") -> str:
    """trainer.sharding resolved: "fsdp", "replicate" or "none". One worker holds the model whole,
    unless fsdp is asked for by name: FSDP2 over a one-rank mesh then gives one GPU bf16 compute
    over float32 master weights (and runs the sharded code path on one card). trainer.offload is
    FSDP2's: with it auto is fsdp at any world, and replicate a ConfigError."""
    if offload != "none":
        if setting == "replicate":
            raise ConfigError(f"trainer.offload={offload} is FSDP2's CPU offload: it needs trainer.sharding=fsdp "
                              f"or auto, got replicate")
        return "fsdp"
    if world == 1:
        return "fsdp" if setting == "fsdp" else "none"
    if setting == "auto":
        # On CPU the 0.8 M-parameter test model's update (32 sequences x 22 tokens, 2 gloo ranks x
        # 1 thread) is slower with per-layer FSDP2 than replicated (DDP): each gather or
        # reduce-scatter of a layer is a costly gloo collective there (benchmarks/RESULTS.md §9).
        # On GPU, FSDP's memory saving decides.
        return "fsdp" if device == "cuda" else "replicate"
    return setting


def master_dtype(setting: str) -> str:
    """`model.dtype` as the master weights' dtype; "auto" is float32."""
    return "bfloat16" if setting == "bfloat16" else "float32"


def compute_dtype(setting: str, master: str, device: str, sharding: str) -> str:
    """The dtype the trainer's forward and backward run in, from `model.compute_dtype` (`setting`),
    the master weights' dtype and the resolved sharding. auto: bf16 under FSDP2 on a GPU (`shard`'s
    mixed-precision policy casts the master weights as it gathers them), else the master weights'
    own; bfloat16: the same policy on any device (a CPU rehearsal of a GPU run). ConfigError where
    the setting cannot be had: bf16 compute over float32 masters is FSDP2's cast (a replicated or
    whole model computes in its weights' dtype), and float32 compute over bf16 masters would only
    upcast rounded weights."""
    if setting == "auto":
        return "bfloat16" if device == "cuda" and sharding == "fsdp" else master
    want = "bfloat16" if setting == "bfloat16" else "float32"
    if want == master:
        return want
    if want == "float32":
        raise ConfigError("model.compute_dtype=float32 needs float32 master weights (model.dtype=float32), "
                          f"got {master}")
    if sharding != "fsdp":
        raise ConfigError(f"model.compute_dtype=bfloat16 over {master} master weights needs FSDP2's "
                          f"mixed precision (trainer.sharding=fsdp); this run's workers hold the model "
                          f"as {sharding!r}")
    return want


def attention(device: str, compute: str) -> tuple[str, str]:
    """(transformers' attn_implementation, a log line saying which and why). flash-attn (the
    optional `[gpu]` extra) where it is installed and can run: on CUDA when the forward computes
    in bf16 (it has no float32 kernels). Packed rows then go through its variable-length kernels;
    sdpa reads them through a block-diagonal mask instead."""
    if device != "cuda":
        return "sdpa", "attention: sdpa"
    if importlib.util.find_spec("flash_attn") is None:
        return "sdpa", "attention: sdpa (flash-attn is not installed: pip install 'reasonrl_fast[gpu]')"
    if compute != "bfloat16":
        return "sdpa", (f"attention: sdpa (flash-attn needs bf16 compute; this worker computes in {compute}: "
                        "bf16 compute over float32 master weights is FSDP2's, trainer.sharding=fsdp)")
    return "flash_attention_2", "attention: flash_attention_2 (packed rows through flash-attn's variable-length kernels)"


def packing_blocker(config) -> str | None:
    """What in the model's config rules packed rows out, or None."""
    model_type = read(config, "model_type") or ""
    if model_type not in PACKED_FAMILIES:
        return f"model_type {model_type!r} is not one of {PACKED_FAMILIES}"
    layer_types = read(config, "layer_types")
    # config.json may leave layer_types to the config class, which derives it from
    # use_sliding_window (Qwen2, Qwen3); Mistral's window is sliding_window alone
    if any(t != "full_attention" for t in (layer_types or [])) or (layer_types is None and read(
            config, "use_sliding_window")) or (model_type == "mistral" and read(config, "sliding_window")):
        return "sliding-window attention"
    return None


def refuse_packing(setting: str, config) -> str | None:
    """data.packing `setting` against the model's config: ConfigError where it is 'true' and the
    model cannot pack; else what rules packing out (`packing_blocker`, None: nothing). The one
    home of the refusal: `packing` applies it on the workers, preflight before Ray starts."""
    blocker = packing_blocker(config)
    if setting == "true" and blocker:
        raise ConfigError(f"data.packing=true: {blocker}; packed rows are not read right by this model "
                          f"(set data.packing=auto or false)")
    return blocker


def packing(setting: str, config, attn: str) -> tuple[bool, bool, str]:
    """data.packing resolved for this model: (on, in one row, a log line). One row where the
    attention has variable-length kernels (flash-attn); else rows as long as the micro-batch's
    longest sequence (trainer/policy.py make_packed_batch says why)."""
    blocker = refuse_packing(setting, config)
    if setting == "false" or blocker:
        return False, False, f"packing: off ({'data.packing=false' if setting == 'false' else blocker})"
    if attn.startswith("flash_attention"):
        return True, True, "packing: on (one row per micro-batch, flash-attn's variable-length kernels)"
    return True, False, (f"packing: on (rows as long as a micro-batch's longest sequence: "
                         f"{attn} attends through a block-diagonal mask)")


def refuse_sequence_parallel(cfg, config) -> None:
    """ConfigError where this model cannot take trainer.sequence_parallel_size, for the preflight
    before Ray starts (`resolve` applies the same `sequence_parallel` on the workers)."""
    sp = cfg.trainer.sequence_parallel_size
    if sp > 1:
        packed, _, note = packing(cfg.data.packing, config, "sdpa")  # the attention decides one row only
        sequence_parallel(sp, config, packed, note, config_head_blocker(config))


def check_heads(heads: int, size: int) -> str | None:
    """Why `size` sequence-parallel workers cannot split a model's attention heads, or None. The
    key/value heads then split too: models/ulysses.py repeats them to lcm(kv_heads, size), which
    divides `heads` (both do), so each repeated head still serves a whole group of query heads."""
    if heads % size:
        return f"{heads} attention heads, which {size} sequence-parallel ranks do not divide"
    return None


def sequence_parallel(sp: int, config, packed: bool, pack_note: str, head_blocker: str | None) -> str:
    """The packing note of a run whose rows `sp` workers cut (Ulysses); ConfigError where this
    model cannot be cut so: its rows unpacked, heads `sp` does not divide, a head whose logits its
    forward changes (each worker runs the head on its own positions)."""
    at = f"trainer.sequence_parallel_size={sp}"
    if not packed:
        raise ConfigError(f"{at} cuts packed rows, and this run's are not: {pack_note}")
    why = check_heads(read(config, "num_attention_heads") or 0, sp)
    if why:
        raise ConfigError(f"{at}: the model has {why}")
    if head_blocker:
        raise ConfigError(f"{at}: {head_blocker}; each worker runs the head on its own positions, which needs a "
                          f"plain linear head")
    return f"packing: on, one row per micro-batch cut over {sp} workers (Ulysses sequence parallel)"


def config_head_blocker(config) -> str | None:
    """What in the model's config (or its text config) changes the logits after the head."""
    for c in {id(x): x for x in (config, text_part(config))}.values():
        get = c.get if isinstance(c, dict) else (lambda k, c=c: getattr(c, k, None))
        for key in SOFTCAPS:
            if get(key) is not None:
                return f"config.{key}={get(key)} soft-caps the logits"
        for key in SCALES:
            v = get(key)
            if v is not None and float(v) != 1.0:
                return f"config.{key}={v} scales the logits"
    return None


def refuse_fused_head(setting: str, blocker: str | None) -> None:
    """ConfigError where model.fused_lm_head `setting` is 'true' but the logits are not
    `final hidden @ head.weight.T` (`blocker` says why; None: they are). The one home of the
    refusal: `fused_head` applies it on the workers, models/lm_head.py `check_model` on the
    driver before any worker starts."""
    if setting == "true" and blocker is not None:
        raise ConfigError(f"model.fused_lm_head=true, but {blocker}: the fused head computes "
                          f"hidden @ lm_head.weight.T only; use model.fused_lm_head=auto or false")


def fused_head(setting: str, blocker: str | None, device: str, tokens: int, vocab: int) -> tuple[bool, str]:
    """(fuse?, one line saying why) for model.fused_lm_head `setting`; `blocker`: why the logits
    are not `final hidden @ head.weight.T` (None: they are); `tokens`: the most response tokens
    one forward sees. ConfigError when `setting` is 'true' and there is a blocker."""
    if setting == "false":
        return False, "fused LM head off (model.fused_lm_head=false)"
    refuse_fused_head(setting, blocker)
    if blocker is not None:
        return False, f"fused LM head off: {blocker} (logits from the model's own forward)"
    if setting == "true":
        return True, "fused LM head on (model.fused_lm_head=true)"
    if device != "cpu":
        return True, f"fused LM head on (auto: {device})"
    elements = tokens * vocab
    if elements >= FUSED_CPU_MIN_ELEMENTS:
        return True, f"fused LM head on (auto: {tokens} tokens x {vocab} vocabulary on CPU)"
    return False, (f"fused LM head off (auto: {tokens} tokens x {vocab} vocabulary = {elements} "
                   f"< {FUSED_CPU_MIN_ELEMENTS} on CPU)")


def tensor_parallel(cfg, config) -> int:
    """rollout.tensor_parallel_size, checked against the model's shape as vLLM shards it: the
    attention heads split evenly over the ranks, the key/value heads split evenly or each
    replicated on a whole number of ranks, and the MLP's columns split evenly. ConfigError naming
    the size that does not divide (the engine and the workers are config's checks)."""
    tp = cfg.rollout.tensor_parallel_size
    if tp == 1:
        return tp
    heads = read(config, "num_attention_heads")
    kv = read(config, "num_key_value_heads") or heads
    sizes = {"num_attention_heads": heads, "intermediate_size": read(config, "intermediate_size")}
    if kv >= tp:
        sizes["num_key_value_heads"] = kv
    for key, value in sizes.items():
        if value and value % tp:
            raise ConfigError(f"rollout.tensor_parallel_size={tp} does not divide the model's {key}={value}: "
                              f"each engine rank holds an equal part; use a size that divides it")
    if kv < tp and tp % kv:
        raise ConfigError(f"rollout.tensor_parallel_size={tp} is not a multiple of the model's "
                          f"num_key_value_heads={kv}: with fewer key/value heads than ranks each head is "
                          f"replicated on tp / heads ranks")
    return tp


def resolve(cfg, model_config, device: str, world: int, spec, *, head_blocker: str | None = None,
            sequences: int | None = None) -> Layout:
    """The Layout of a run of `cfg` on `world` workers of `device` ("cpu" or "cuda"; a
    torch.device is read by its type) for the model whose config is `model_config`, sampling with
    the rollout engine's spec `spec` (rollout/registry.py `get_rollout(cfg.rollout.backend)`).
    `head_blocker`: what a built model shows against the fused head beyond its config
    (models/lm_head.py `head_blocker`; None where no model was built, as in the planner).
    `sequences`: the engine's batch at once (default: a trainer engine's rollout batch).
    ConfigError where the settings cannot hold for this model and device."""
    device = getattr(device, "type", device)
    sharding = sharding_mode(cfg.trainer.sharding, device, world, cfg.trainer.offload)
    master = master_dtype(cfg.model.dtype)
    compute = compute_dtype(cfg.model.compute_dtype, master, device, sharding)
    attn, attn_note = attention(device, compute)
    packed, one_row, pack_note = packing(cfg.data.packing, model_config, attn)
    blocker = head_blocker or config_head_blocker(model_config)
    sp = cfg.trainer.sequence_parallel_size
    if sp > 1:
        one_row, pack_note = True, sequence_parallel(sp, model_config, packed, pack_note, blocker)
    fused, head_note = fused_head(cfg.model.fused_lm_head, blocker, device, tokens_per_forward(cfg, world),
                                  read(model_config, "vocab_size"))
    rollout_dtype = spec.dtype(compute, device)
    tp = tensor_parallel(cfg, model_config)
    return Layout(device=device, world=world, sharding=sharding, weight_dtype=master, compute_dtype=compute,
                  attention=attn, packed=packed, one_row=one_row, fused=fused, rollout_dtype=rollout_dtype,
                  kv_cache_bytes=spec.kv_cache_bytes(cfg, model_config, rollout_dtype, device, sequences),
                  engine_share=spec.memory_share(cfg, device), engine_tp=tp, sequence_parallel=sp,
                  offload=cfg.trainer.offload != "none",
                  engine_sleeps=device == "cuda" and cfg.trainer.placement != "split",
                  notes={"sharding": f"data parallel: {sharding} (trainer.sharding={cfg.trainer.sharding}"
                                     + (f", trainer.offload={cfg.trainer.offload})" if cfg.trainer.offload != "none"
                                        else ")"),
                         "attention": attn_note, "packing": pack_note, "lm_head": head_note})


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype name of the Layout."""
    return {"float32": 4, "bfloat16": 2, "float16": 2}[name]
