"""The rollout registry: names to engine classes imported on lookup, an unknown name that lists
the known ones, and every engine's facts (preflight, log, dtype, memory, the trainer copy)
answered in a process where torch cannot be imported (the planner's and the config checks'
machines). Unit tier: one child interpreter that imports no torch (about a second)."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from reasonrl_fast.config import load_config
from reasonrl_fast.layout import resolve
from reasonrl_fast.rollout import ROLLOUTS, EngineSpec, get_rollout
from reasonrl_fast.rollout.registry import engine_device
from reasonrl_fast.rollout.vllm import INSTALL, kv_cache_bytes, kv_shape
from tests.helpers import venvs

# A Qwen2-like config.json: 2 layers, 2 key/value heads of 32 (1024 bytes a token in float32).
MODEL = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 256, "vocab_size": 99}
RUN = ["data.prompts_per_step=8", "trainer.workers_per_node=2", "rollout.n=8", "data.max_prompt_length=16",
       "rollout.max_new_tokens=32", "rollout.sync_every=2"]

# Blocks torch (and anything under it) before the package is imported: an import of it raises, as
# on a machine without torch. Then every fact of every registered engine, as JSON. The run's
# settings come in as load_config's values (the config module is not what is tested here).
CHILD = r"""
import importlib.abc, json, os, sys, types

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"No module named {name!r} (blocked)")
        return None

sys.meta_path.insert(0, NoTorch())
import reasonrl_fast.rollout
from reasonrl_fast.errors import UserError
from reasonrl_fast.rollout.registry import ROLLOUTS, get_rollout

def tree(d):
    return types.SimpleNamespace(**{k: tree(v) if isinstance(v, dict) else v for k, v in d.items()})

def config(settings):  # the values, with the derived ones engines read: the data section's, the longest sequence
    from reasonrl_fast.config.sections import DataConfig, Root

    ns = tree(settings)
    ns.data.gen_prompts = types.MethodType(DataConfig.gen_prompts, ns.data)
    ns.max_sequence = Root.max_sequence.fget(ns)
    return ns

settings, run_dir, model = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
cfg = config(settings)
sized = config({**settings, "rollout": {**settings["rollout"], "kv_cache_memory_bytes": 12345}})
share = config({**settings, "rollout": {**settings["rollout"], "gpu_memory_utilization": 0.7}})
tp2 = config({**settings, "rollout": {**settings["rollout"], "tensor_parallel_size": 2}})
facts = {}
for name in ROLLOUTS:
    r = get_rollout(name)
    try:
        version = r.preflight(model["architectures"])
    except UserError as e:
        version = "UserError: " + str(e)
    path = r.log_path(run_dir, 0)
    if path:  # rank 0's engine log ends with a line; rank 1 has none
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("starting\nKV cache: out of memory\n\n")
    facts[name] = {
        "class": type(r).__module__ + ":" + type(r).__name__, "needs_trainer_copy": r.needs_trainer_copy,
        "available": r.available(), "preflight": version, "describe": r.describe(cfg, "/runs/a", "ENGINE 9.9"),
        "log_path": r.log_path("/runs/a", 1), "error_note": [r.error_note(run_dir, 0), r.error_note(run_dir, 1)],
        "dtype": {"cpu": r.dtype("float32", "cpu"), "cuda": r.dtype("float32", "cuda"),
                  "bf16 cpu": r.dtype("bfloat16", "cpu")},
        "kv_cache_bytes": {"cpu": r.kv_cache_bytes(cfg, model, "float32", "cpu"),
                           "cuda": r.kv_cache_bytes(cfg, model, "float32", "cuda"),
                           "cpu, 1 sequence": r.kv_cache_bytes(cfg, model, "float32", "cpu", 1),
                           "cuda, bf16, sized": r.kv_cache_bytes(sized, model, "bfloat16", "cuda")},
        "memory_share": {"cpu": r.memory_share(cfg, "cpu"), "cuda": r.memory_share(cfg, "cuda"),
                         "cuda, 0.7": r.memory_share(share, "cuda"), "cuda, sized": r.memory_share(sized, "cuda")},
        "between_tokens": [r.between_tokens(cfg), r.between_tokens(tp2)],
    }
try:
    import torch
    blocked = False
except ImportError:
    blocked = "torch" not in sys.modules
print(json.dumps({"facts": facts, "torch_blocked": blocked}))
"""


def _facts_without_torch(tmp_path, cfg) -> dict:
    """Every fact of every engine, from a child in which torch cannot be imported."""
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(dataclasses.asdict(cfg)), str(tmp_path / "run"),
                        json.dumps(MODEL)], cwd=venvs.REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["torch_blocked"], "the child imported torch after all"
    return out["facts"]


def test_every_engines_facts_without_torch(tmp_path):
    cfg = load_config(None, RUN)
    facts = _facts_without_torch(tmp_path, cfg)
    assert set(facts) == {"hf", "vllm"}
    # hf: samples from the trainer's own copy, in its compute dtype; no check, no log, no cache size
    hf = facts["hf"]
    assert hf["needs_trainer_copy"] and hf["available"] and hf["preflight"] is None and hf["describe"] is None
    assert hf["log_path"] is None and hf["error_note"] == [None, None]
    assert hf["dtype"] == {"cpu": "float32", "cuda": "float32", "bf16 cpu": "bfloat16"}
    assert set(hf["kv_cache_bytes"].values()) == {None} and set(hf["memory_share"].values()) == {None}
    assert hf["between_tokens"] == [True, True]  # its weights can land mid-generation
    # vllm: loads the model itself, in bf16 on a GPU; on CPU a KV cache in bytes for the worker's
    # batch (32 sequences of 48 tokens: 35 blocks of 128 x 1024 bytes, rollout/vllm.py
    # `kv_cache_bytes`; one sequence: ceil(1.05) + 1 blocks), on a GPU a share of the device
    v = facts["vllm"]
    assert not v["needs_trainer_copy"] and v["class"] == "reasonrl_fast.rollout.vllm:VLLM"
    assert v["preflight"].startswith("UserError: rollout.backend=vllm: vLLM is not importable")
    assert INSTALL in v["preflight"]
    run = str(tmp_path / "run")
    assert v["describe"] == ("rollout: ENGINE 9.9, one engine per worker, its log in /runs/a/rollout; "
                             "weights synced every 2 step(s)")
    assert v["log_path"] == "/runs/a/rollout/vllm-rank1.log"
    assert v["error_note"] == [
        f"its vLLM engine's last log line ({run}/rollout/vllm-rank0.log): KV cache: out of memory", None]
    assert v["dtype"] == {"cpu": "float32", "cuda": "bfloat16", "bf16 cpu": "bfloat16"}
    want = kv_cache_bytes(cfg, kv_shape(MODEL), 4)
    assert want == 35 * 128 * 1024
    assert v["kv_cache_bytes"] == {"cpu": want, "cuda": None, "cpu, 1 sequence": 3 * 128 * 1024,
                                   "cuda, bf16, sized": 12345}
    assert v["memory_share"] == {"cpu": None, "cuda": 0.5, "cuda, 0.7": 0.7, "cuda, sized": None}
    # mid-generation loads in an engine of one process; a tensor-parallel one's wait for its end
    assert v["between_tokens"] == [True, False]


def test_the_package_and_the_registry_import_no_torch():
    code = ("import sys, reasonrl_fast.rollout, reasonrl_fast.rollout.registry; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]")
    p = subprocess.run([sys.executable, "-c", code], cwd=venvs.REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]


def test_unknown_engine_lists_the_known_ones(monkeypatch):
    with pytest.raises(ValueError, match=r"unknown rollout engine 'sglang': known engines are hf, vllm$"):
        get_rollout("sglang")
    with pytest.raises(ValueError, match="known engines are hf, vllm"):
        get_rollout(None)
    # one line adds an engine; the error lists it from then on
    monkeypatch.setitem(ROLLOUTS, "fake", "tests.helpers.fake_rollout:FakeSpec")
    fake = get_rollout("fake")
    assert isinstance(fake, EngineSpec) and fake.name == "fake" and get_rollout("fake") is fake
    with pytest.raises(ValueError, match="known engines are hf, vllm, fake"):
        get_rollout("sglang")


def test_the_spec_builds_the_engine_the_layout_decides(tmp_path, monkeypatch):
    """The Layout asks the engine's spec for its dtype and KV cache; the spec builds the engine
    from that Layout."""
    seen = {}

    class Spy(EngineSpec):
        name = "spy"

        def dtype(self, compute, device):
            return "bfloat16"

        def kv_cache_bytes(self, cfg, model_config, dtype, device, sequences=None):
            return model_config["num_hidden_layers"] * 1000 + (sequences or 0)

        def build(self, cfg, layout, lm, model_path, tok, log=print, *, device=None, log_path=None):
            seen.update(device=engine_device(layout, device), dtype=getattr(torch, layout.rollout_dtype),
                        kv_bytes=layout.kv_cache_bytes, log_path=log_path)
            return "engine"

    (tmp_path / "config.json").write_text(json.dumps(MODEL))
    cfg = load_config(None, RUN)
    layout = resolve(cfg, MODEL, "cpu", 2, Spy(), sequences=7)
    assert (layout.rollout_dtype, layout.kv_cache_bytes) == ("bfloat16", 2007)
    out = Spy().build(cfg, layout, None, str(tmp_path), None, log_path="x.log")
    assert out == "engine"
    assert seen == {"device": torch.device("cpu"), "dtype": torch.bfloat16, "kv_bytes": 2007, "log_path": "x.log"}

