"""verl 0.9.1's own RL dataset (`RLHFDataset`), run in a virtual
environment of its own, so that tests can check that a parquet file `prepare` writes reads there
as it reads here.

verl 0.9.1 pins transformers < 5.11 while the project takes the newest, so the environment is
separate: created once under ~/.cache/reasonrl_fast/venv-verl-data-0.9.1 (`python -m venv`, then
torch 2.13.0 (the local CPU wheel), a transformers verl accepts, datasets, omegaconf, pillow,
and verl itself with --no-deps) and reused once its completion marker exists; a file lock keeps
two test processes from building it at the same time. Failing to build it raises
`VerlDataEnvError` with the reason: a comparison that silently did not run would prove nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.venvs import ROOT as VENVS
from tests.venvs import VenvError, ensure_venv

VERL_VERSION = "0.9.1"
# The newest release inside verl 0.9.1's pin (transformers!=5.6.0,<5.11,>=5.5.3).
TRANSFORMERS_VERSION = "5.10.4"
VENV_DIR = VENVS / f"venv-verl-data-{VERL_VERSION}"
_PACKAGES = ["torch==2.13.0", f"transformers=={TRANSFORMERS_VERSION}", "datasets", "omegaconf",
             "pillow", "numpy", "pyarrow", "pandas"]

# Runs inside the venv. verl/__init__.py imports DataProto, and with it Ray and tensordict, which
# the dataset never uses: a bare `verl` package object pointing at the installed folder lets
# `verl.utils.dataset.rl_dataset` import without running it.
_DRIVER = r"""
import importlib.util, json, sys, types
spec = importlib.util.find_spec("verl")
pkg = types.ModuleType("verl")
pkg.__path__ = list(spec.submodule_search_locations)
sys.modules["verl"] = pkg
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.utils.dataset.rl_dataset import RLHFDataset

parquet, tokenizer_dir, max_prompt_length = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(tokenizer_dir)
config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": max_prompt_length,
                           "truncation": "error", "filter_overlong_prompts": True,
                           "filter_overlong_prompts_workers": 1,
                           "return_raw_chat": True, "cache_dir": sys.argv[4]})
ds = RLHFDataset(data_files=[parquet], tokenizer=tok, config=config)
rows = []
for i in range(len(ds)):
    item = ds[i]
    # verl 0.9.1's dataset hands the rollout the raw messages, which renders them with the
    # tokenizer's chat template and the generation prompt (apply_chat_template_kwargs empty)
    messages = [dict(m) for m in item["raw_prompt"]]
    rows.append({"prompt": tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                 "raw_prompt": messages,
                 "ground_truth": item["reward_model"]["ground_truth"],
                 "data_source": item["data_source"],
                 "ability": item["ability"],
                 "extra_info": {k: v for k, v in item["extra_info"].items()
                                if isinstance(v, (str, int, float, bool))}})
# verl prints progress on stdout too: the answer is the line after the marker
print("\n@@rows@@\n" + json.dumps(rows))
"""


VerlDataEnvError = VenvError


def ensure_verl_data_env(timeout: float = 1200.0) -> tuple[Path, float]:
    """The venv's python, and the seconds spent building it now (0.0 when it was cached)."""
    return ensure_venv(VENV_DIR.name, [_PACKAGES, ["--no-deps", f"verl=={VERL_VERSION}"]], timeout)


def verl_dataset_rows(parquet: str, tokenizer_dir: str, max_prompt_length: int = 1024,
                      timeout: float = 300.0) -> list[dict]:
    """Each row of `parquet` as verl's RLHFDataset gives it (its length filter on, so a prompt
    verl would drop is missing): the messages rendered with the chat template as verl's rollout
    renders them, the raw messages, the ground truth, the data source, the ability and the
    scalar fields of extra_info."""
    python, _ = ensure_verl_data_env()
    cache = os.path.join(os.path.dirname(os.path.abspath(parquet)), "verl_cache")
    try:
        proc = subprocess.run([str(python), "-c", _DRIVER, parquet, tokenizer_dir,
                               str(max_prompt_length), cache],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONIOENCODING": "utf-8", "HF_HUB_OFFLINE": "1",
                                   "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    except subprocess.TimeoutExpired:
        raise VerlDataEnvError(f"verl's RLHFDataset gave no answer within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise VerlDataEnvError(f"verl's RLHFDataset failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    _, marker, answer = proc.stdout.rpartition("\n@@rows@@\n")
    if not marker:
        raise VerlDataEnvError(f"verl's RLHFDataset printed no rows:\n{proc.stdout[-3000:]}")
    return json.loads(answer)
