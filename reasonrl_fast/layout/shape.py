"""What a model's config says about its shape and its context, read one way by the trainer's
preflight (preflight.py), the planner (plan.py, also for the shipped shapes of models without
weights, shipped_shapes.py) and the eval command; and `Shape`, the sizes the planner counts.

A config is a transformers `PretrainedConfig` or config.json's dict; a multimodal one is read
through its text part. The context is the longest sequence, prompt and response together, a run
may give the model: `model.max_position_embeddings` when set, else the config's own."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from reasonrl_fast.errors import ConfigError
from reasonrl_fast.layout.shipped_shapes import SHAPES

SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
"""The fields every decoder-only causal LM's config has, each a positive integer."""

_OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings")

_FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")
"""Switches the parameter count and the attention read, each true or false when set: a quoted
"false" would read as true."""


def text_part(config):
    """The decoder's own settings: a multimodal config's text config, else the config itself."""
    if isinstance(config, Mapping):
        inner = config.get("text_config")
        return inner if "hidden_size" not in config and isinstance(inner, Mapping) else config
    get_text = getattr(config, "get_text_config", None)
    return get_text() if callable(get_text) else config


def read(config, key: str):
    """`key` of `config`'s text part, None when unset. A PretrainedConfig answers through its
    attribute map (GPT-2's n_positions is its max_position_embeddings); a dict as written."""
    c = text_part(config)
    mapping = isinstance(c, Mapping)
    get = c.get if mapping else lambda k: getattr(c, k, None)
    value = get(key)
    if value is None and key == "intermediate_size" and ("n_inner" in c if mapping else hasattr(c, "n_inner")):
        # GPT-2's family names its MLP width n_inner, None meaning 4 x the hidden size
        hidden = get("hidden_size") or get("n_embd")
        value = get("n_inner") or (4 * hidden if isinstance(hidden, int) else None)
    return value


def check_shape(config, where: str, vocab: int | None = None) -> None:
    """A ConfigError naming the first field that cannot belong to a decoder-only causal LM:
    a missing size or one that is not a positive integer (a bool, a float, a string), a switch
    that is not true or false, query heads that do not split into whole groups per key/value
    head, a hidden size that is not heads x head size where the config gives no head_dim, or (with
    `vocab`, the tokenizer's length) a vocabulary too small for the tokenizer's ids. `where`
    names the config in the message (`model.path='/x': config.json`)."""
    missing = [k for k in SIZES if read(config, k) is None]
    if missing:
        raise ConfigError(f"{where}: no {', '.join(missing)} (a decoder-only causal LM's config.json is expected)")
    bad = [f"{k}={v!r}" for k in SIZES + _OPTIONAL_SIZES if (v := read(config, k)) is not None
           and (isinstance(v, bool) or not isinstance(v, int) or v < 1)]
    if bad:
        raise ConfigError(f"{where}: {', '.join(bad)}: sizes must be positive integers")
    bad = [f"{k}={v!r}" for k in _FLAGS if (v := read(config, k)) is not None and not isinstance(v, bool)]
    if bad:
        raise ConfigError(f"{where}: {', '.join(bad)}: must be true or false")
    hidden, heads = read(config, "hidden_size"), read(config, "num_attention_heads")
    kv = read(config, "num_key_value_heads") or heads
    if heads % kv:
        raise ConfigError(f"{where}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv} "
                          f"(each key/value head serves a whole group of query heads)")
    if read(config, "head_dim") is None and hidden % heads:
        raise ConfigError(f"{where}: hidden_size={hidden} is not num_attention_heads={heads} x a head size, "
                          f"and no head_dim is given")
    size = read(config, "vocab_size")
    if vocab is not None and size < vocab:
        raise ConfigError(f"{where}: vocab_size={size} is below the tokenizer's {vocab} tokens: its last ids "
                          f"would index past the embedding table")


def model_fields(path: str, what: str) -> tuple[dict, str, str | None]:
    """(config.json's fields of the model at `path`, where they come from for messages, a note when
    the shipped shape stands in): its directory's config.json when there is one, else the shipped
    shape named like the directory (shipped_shapes.SHAPES: the planner and the CPU rehearsal read the
    recipes' models without their weights), else a ConfigError naming `what`
    (`model.path='/models/X'`)."""
    cfg_file = os.path.join(path, "config.json")
    if os.path.isfile(cfg_file):
        try:
            with open(cfg_file) as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{what}: config.json cannot be read ({e})") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{what}: config.json is not a JSON object")
        return d, f"{what}: config.json", None
    name = os.path.basename(os.path.normpath(path))
    if name in SHAPES:
        return ({k: v for k, v in SHAPES[name].items() if not k.startswith("_")}, f"shipped_shapes.SHAPES[{name!r}]",
                f"{what} has no config.json here: using the shipped shape of {SHAPES[name]['_source']}")
    raise ConfigError(f"{what}: no config.json there, and no shipped shape is named {name!r} "
                      f"(shipped: {', '.join(SHAPES)}); give a local model directory (only its config.json is read)")


def model_context(setting: int | None, config) -> int | None:
    """The model's context: `setting` (model.max_position_embeddings) when set, else the config's
    own max_position_embeddings; None when the config names none."""
    return setting if setting is not None else read(config, "max_position_embeddings")


def context_overrides(setting: int | None) -> dict:
    """What model.max_position_embeddings changes in the model's config, as keyword arguments of
    transformers' from_pretrained (model and config alike) and as vLLM's `hf_overrides`: nothing
    when unset. Only the position limit moves: RoPE's θ and scaling stay as config.json has them."""
    return {} if setting is None else {"max_position_embeddings": setting}


def longest_sequence(cfg) -> tuple[int, str, list[int]]:
    """The run's longest sequence (config `max_sequence`), the settings that make it and their
    values, for errors."""
    p, r, n = cfg.data.max_prompt_length, cfg.rollout.max_new_tokens, cfg.max_sequence
    if n < p + r:
        return n, "rollout.max_sequence_tokens", [n]
    return n, "data.max_prompt_length + rollout.max_new_tokens", [p, r]


def _sum(names: str, values: list[int]) -> str:
    """`names = a + b = total` (`names = a` for one value)."""
    terms = " + ".join(map(str, values))
    return f"{names} = {terms}" + (f" = {sum(values)}" if len(values) > 1 else "")


def context_problem(cfg, config, source: str) -> str | None:
    """Why the run's longest sequence (`longest_sequence`) does not fit the policy's context (None
    when it fits, or the config names no context). vLLM refuses such an engine when a worker
    builds it; a Hugging Face forward runs past the trained positions without a word. `source`:
    where `config` was read (`config.json of model.path='/x'`)."""
    n, names, values = longest_sequence(cfg)
    need = _sum(names, values)
    setting = cfg.model.max_position_embeddings
    have = model_context(setting, config)
    if have is None or n <= have:
        return None
    if setting is not None:
        return (f"model.max_position_embeddings={setting}: below {need}; raise it to at least {n}, or shorten "
                f"the prompt or the response")
    return (f"model.max_position_embeddings: the model's context is {have} tokens ({source}), below {need}: "
            f"set model.max_position_embeddings={n} or more (the published Qwen2.5-Math RL recipes raise "
            f"4096 to 32768, RoPE θ unchanged), or shorten the prompt or the response")


def genrm_context_problem(cfg, config, source: str) -> str | None:
    """Why a verdict request does not fit the context of the GenRM our server loads (`config`:
    its config.json, read as it is: model.max_position_embeddings is the policy's). A request
    holds the problem and the solution, up to the policy's longest sequence (`longest_sequence`),
    and the verdict, fapo.genrm.max_tokens; the server shortens a verdict that does not fit, which
    then most likely has no index and gives no penalty."""
    (n, names, values), v = longest_sequence(cfg), cfg.fapo.genrm.max_tokens
    have = model_context(None, config)
    if have is None or n + v <= have:
        return None
    fix = (f"lower fapo.genrm.max_tokens to {have - n} or less" if have - n > 0
           else "shorten the policy's prompt or response")
    return (f"fapo.genrm.max_tokens={v}: the GenRM's context is {have} tokens ({source}), below a verdict "
            f"request's {_sum(names + ' + fapo.genrm.max_tokens', values + [v])}: {fix}, or serve a model with a "
            f"longer context")


def check_context(cfg, config, source: str) -> None:
    """A ConfigError with `context_problem`'s line, if any."""
    problem = context_problem(cfg, config, source)
    if problem:
        raise ConfigError(problem)


@dataclass(frozen=True)
class Shape:
    """What the memory planner (plan.py) reads of a decoder-only (Llama-family) model's config.json."""

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
    config: dict = field(default_factory=dict, compare=False, repr=False)
    """The config.json fields it was read from (what layout/resolve.py `resolve` reads)."""

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
    after the trainer's own shape check (`check_shape`); the config it was read from is kept."""
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
                 sliding=bool(d.get("use_sliding_window")) or (mt == "mistral" and bool(d.get("sliding_window"))),
                 config=d)


def zhead_params(hidden: int, layers: int) -> int:
    """ops/zhead.py: (layers - 1) x [Linear(H, H), LayerNorm(H)] + Linear(H, 1)."""
    return (layers - 1) * (hidden * hidden + 3 * hidden) + hidden + 1 if layers else 0
