"""verl 0.9.1's own code, run in its venv (tests/helpers/venvs.py), for the tests that compare
ours with it: its DAPO math scorer and its RL dataset (`RLHFDataset`). Each function takes the
venv's python (the `verl_python` fixture) and runs one child process: JSON or arguments in,
JSON out."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.helpers.venvs import VenvError, child_env

# The start of the drivers below that run inside the venv. It loads math_dapo.py by file path
# instead of `import verl...`: importing any verl submodule runs verl/__init__.py first, which
# imports DataProto and with it Ray and tensordict, which the scorer never uses (the module itself
# needs only `re` and `typing`).
_LOAD_MATH_DAPO = r"""
import importlib.util, json, os, sys, sysconfig
path = os.path.join(sysconfig.get_paths()["purelib"], "verl", "utils", "reward_score",
                    "math_dapo.py")
spec = importlib.util.spec_from_file_location("verl_math_dapo", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
"""

# Runs inside the venv: verl's DAPO scorer on each case.
_DAPO_DRIVER = _LOAD_MATH_DAPO + r"""
out = []
for case in json.load(sys.stdin):
    try:
        out.append({"result": mod.compute_score(**case)})
    except Exception as e:  # a raise is a behaviour to compare too
        out.append({"error": type(e).__name__})
tables = {"SUBSTITUTIONS": mod.SUBSTITUTIONS, "REMOVED_EXPRESSIONS": mod.REMOVED_EXPRESSIONS}
json.dump({"results": out, "tables": tables}, sys.stdout)
"""

# Runs inside the venv. verl/__init__.py imports DataProto, and with it Ray and tensordict, which
# the dataset never uses: a bare `verl` package object pointing at the installed folder lets
# `verl.utils.dataset.rl_dataset` import without running it.
_DATASET_DRIVER = r"""
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


def _drive(python: Path, driver: str, cases: list[dict], what: str, timeout: float):
    """`driver` run in the venv's python on `cases` (JSON on stdin); its JSON answer, or a
    VenvError naming `what` when it fails or overruns."""
    try:
        proc = subprocess.run([str(python), "-c", driver], input=json.dumps(cases),
                              capture_output=True, text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired:
        raise VenvError(f"verl's {what} gave no answer within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise VenvError(f"verl's {what} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def _one_per_case(out: list, cases: list[dict], what: str) -> list:
    if len(out) != len(cases):
        raise VenvError(f"verl's {what} answered {len(out)} of {len(cases)} cases")
    return out


def verl_dapo_scores(python: Path, cases: list[dict], timeout: float = 300.0) -> tuple[list[dict], dict]:
    """verl's math_dapo.compute_score(**case) for each case, as {"result": dict} or
    {"error": exception type name}, computed in the venv's python; and the module's
    normalisation tables (name -> list of entries)."""
    answer = _drive(python, _DAPO_DRIVER, cases, "scorer", timeout)
    return _one_per_case(answer["results"], cases, "scorer"), answer["tables"]


def verl_dataset_rows(python: Path, parquet: str, tokenizer_dir: str, max_prompt_length: int = 1024,
                      timeout: float = 300.0) -> list[dict]:
    """Each row of `parquet` as verl's RLHFDataset gives it (its length filter on, so a prompt
    verl would drop is missing): the messages rendered with the chat template as verl's rollout
    renders them, the raw messages, the ground truth, the data source, the ability and the
    scalar fields of extra_info."""
    cache = os.path.join(os.path.dirname(os.path.abspath(parquet)), "verl_cache")
    try:
        proc = subprocess.run([str(python), "-c", _DATASET_DRIVER, parquet, tokenizer_dir,
                               str(max_prompt_length), cache],
                              capture_output=True, text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired:
        raise VenvError(f"verl's RLHFDataset gave no answer within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise VenvError(f"verl's RLHFDataset failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    _, marker, answer = proc.stdout.rpartition("\n@@rows@@\n")
    if not marker:
        raise VenvError(f"verl's RLHFDataset printed no rows:\n{proc.stdout[-3000:]}")
    return json.loads(answer)


# Runs inside the venv: the published FAPO runs' verifier (verl recipe/fapo/reward_fn_reasoning.py
# `verify`, which verl's package does not ship) written out over verl 0.9.1's own math_dapo
# helpers: the last 300 characters, the last \boxed{} in them, DAPO-normalised, compared as text.
_BOX_DRIVER = _LOAD_MATH_DAPO + r"""
out = []
for case in json.load(sys.stdin):
    tail = case["solution_str"][-300:]
    boxed = mod.last_boxed_only_string(tail)
    extracted = mod.remove_boxed(boxed) if boxed is not None else "[INVALID]"
    pred = mod.normalize_final_answer(extracted)
    out.append({"acc": pred == mod.normalize_final_answer(case["ground_truth"]), "pred": pred,
                "boxed": boxed is not None})
json.dump(out, sys.stdout)
"""


def verl_box_verdicts(python: Path, cases: list[dict], timeout: float = 300.0) -> list[dict]:
    """The published FAPO verifier's {"acc", "pred", "boxed"} for each {"solution_str",
    "ground_truth"} case, computed with verl's own helpers in the venv's python."""
    return _one_per_case(_drive(python, _BOX_DRIVER, cases, "box verifier", timeout), cases, "box verifier")
