"""Checks of the vllm rollout engine's KV cache memory that run inside the vLLM venv
(tests/rollout/test_vllm.py starts this file there): `python vllm_memory_checks.py WORKDIR CHECK`,
one engine per process. Each check raises on failure; the last line printed is "ok" when it
passed, or "skip: why" when this machine cannot pose it.

CHECK is one of
- sizes: `kv_cache_bytes`'s per-block bytes equal vLLM's own page size for the model (no engine);
- resident: the process first holds more resident memory than 0.05 of the NUMA node, as a trainer
  worker holds its model and optimiser beside the engine; a fraction of the node (vLLM's
  `gpu_memory_utilization`) then leaves the KV cache less than nothing, and vLLM refuses to start.
  The engine that the spec's `build` makes starts anyway (its KV cache in bytes) and samples;
- fraction: the same process with vLLM sized by the fraction 0.05, as the rollout did before:
  vLLM refuses (the condition `resident` survives is a real one);
- refused: a KV cache larger than the machine: a ConfigError naming
  rollout.kv_cache_memory_bytes and the bytes asked for."""

import math
import os
import sys
from types import SimpleNamespace

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from reasonrl_fast.config import load_config
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.layout import resolve
from reasonrl_fast.models.loading import load_model_config
from reasonrl_fast.rollout import get_rollout
from reasonrl_fast.rollout.vllm import CPU_BLOCK_TOKENS, kv_cache_bytes, kv_shape

EOS = 2
TOK = SimpleNamespace(pad_token_id=0, eos_token_id=EOS)  # what the engine reads of a tokenizer
OLD_FRACTION = 0.05  # the rollout's former default on CPU
SKIP = f"holding {OLD_FRACTION} of this node's memory would take over a third of what is free"



def cpu_layout(cfg, path: str):
    """The Layout a CPU worker of `cfg` resolves for the model at `path` (layout/)."""
    t = cfg.trainer
    return resolve(cfg, load_model_config(path), "cpu", t.nnodes * t.workers_per_node, get_rollout("vllm"))

def model_dir(work: str) -> str:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=61, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         eos_token_id=EOS, pad_token_id=0, tie_word_embeddings=False)
    path = os.path.join(work, "tiny")
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def run_config(*overrides: str):
    return load_config(None, ["rollout.backend=vllm", "data.max_prompt_length=16", "rollout.max_new_tokens=32",
                              "data.prompts_per_step=4", "rollout.n=4", "trainer.workers_per_node=1", *overrides])


def node_memory() -> tuple[int, int]:
    """(total, available) bytes of the NUMA node vLLM's CPU worker reads (its own function)."""
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

    info = get_memory_node_info(get_allowed_cpu_list()[0].numa_node)
    return info.total_memory, info.available_memory


def hold_resident_memory():
    """A touched tensor that brings this process's resident memory past OLD_FRACTION of the node
    (plus 256 MiB), or None when that would take more than a third of the available memory."""
    import psutil

    total, available = node_memory()
    need = math.ceil(OLD_FRACTION * total) + 256 * 2 ** 20 - psutil.Process().memory_info().rss
    if need > available / 3:
        return None
    ballast = torch.ones(max(need, 0) // 4 + 1, dtype=torch.float32)  # ones: every page written
    assert psutil.Process().memory_info().rss > OLD_FRACTION * total
    return ballast


def check_sizes(work: str) -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    path = model_dir(work)
    config = Qwen2Config.from_pretrained(path)
    layers, kv_heads, head_dim = kv_shape(config)
    spec = FullAttentionSpec(block_size=CPU_BLOCK_TOKENS, num_kv_heads=kv_heads, head_size=head_dim,
                             dtype=torch.float32)
    cfg = run_config()
    # one sequence of 48 tokens in one block, 5 % spare rounded up, vLLM's null block
    one = kv_cache_bytes(cfg, (layers, kv_heads, head_dim), 4, sequences=1)
    assert one == 3 * layers * spec.page_size_bytes, (one, spec.page_size_bytes)


def check_resident(work: str) -> None:
    path = model_dir(work)
    ballast = hold_resident_memory()
    if ballast is None:
        return SKIP
    cfg = run_config()
    notes = []
    engine = get_rollout("vllm").build(cfg, cpu_layout(cfg, path), None, path, TOK, notes.append,
                                       device=torch.device("cpu"), log_path=os.path.join(work, "vllm.log"))
    cache = engine.llm.llm_engine.vllm_config.cache_config
    want = kv_cache_bytes(cfg, kv_shape(Qwen2Config.from_pretrained(path)), 4)
    assert cache.kv_cache_memory_bytes == want, (cache.kv_cache_memory_bytes, want)
    out = engine.generate([[5, 9, 11], [7]], 4, 1.0, 1.0, 16, list(range(8)))
    assert len(out.tokens) == 8 and all(out.tokens), out.tokens
    engine.close()
    del ballast


def check_fraction(work: str) -> None:
    from vllm import LLM

    path = model_dir(work)
    ballast = hold_resident_memory()
    if ballast is None:
        return SKIP
    try:
        LLM(model=path, skip_tokenizer_init=True, dtype=torch.float32, max_model_len=48, enforce_eager=True,
            gpu_memory_utilization=OLD_FRACTION)
    except ValueError as e:
        assert "memory" in str(e).lower(), e
        print(f"refused as expected: {' '.join(str(e).split())[:300]}")
    else:
        raise AssertionError("vLLM started with a fraction of the node below the process's resident memory")
    del ballast


def check_refused(work: str) -> None:
    path = model_dir(work)
    total, _ = node_memory()
    asked = 4 * total
    try:
        cfg = run_config(f"rollout.kv_cache_memory_bytes={asked}")
        get_rollout("vllm").build(cfg, cpu_layout(cfg, path), None, path, TOK, device=torch.device("cpu"),
                                  log_path=os.path.join(work, "vllm.log"))
    except ConfigError as e:
        text = str(e)
        assert "rollout.kv_cache_memory_bytes" in text and str(asked) in text and "available" in text, text
        print(f"refused: {text[:400]}")
    else:
        raise AssertionError(f"an engine started with a KV cache of {asked} bytes")


if __name__ == "__main__":
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    torch.set_num_threads(1)
    skipped = {"sizes": check_sizes, "resident": check_resident, "fraction": check_fraction,
               "refused": check_refused}[sys.argv[2]](sys.argv[1])
    print(f"skip: {skipped}" if skipped else "ok", flush=True)
