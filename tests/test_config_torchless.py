"""The settings load without torch and without the compiled extension: in a child interpreter
where importing either raises ImportError (a meta-path finder that also records the attempt),
every shipped config loads, an algorithm's facts answer as they do here, and a typo'd key is one
ConfigError, which the train command prints as one line with exit status 2."""

import glob
import json
import os
import subprocess
import sys

import pytest

from reasonrl_fast.algos import get_algo
from reasonrl_fast.config import load_config

pytestmark = pytest.mark.proc  # a child interpreter

ROOT = os.path.join(os.path.dirname(__file__), "..")

CHILD = r"""
import contextlib, glob, importlib.abc, io, json, runpy, sys

BLOCKED = ("torch", "reasonrl_fast._C")
tried = []


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            tried.append(name)
            raise ImportError(f"{name} is not installed here")
        return None


sys.meta_path.insert(0, Block())
import reasonrl_fast.config
from reasonrl_fast.algos import get_algo
from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast.tasks import TASKS, get_task

out = {"import": sorted(m for m in sys.modules if m.split(".")[0] == "torch"), "facts": {}}
for path in sorted(glob.glob("configs/*.yaml")):
    cfg = load_config(path)
    a = get_algo(cfg.algo)
    out["facts"][path] = [a.name, a.zhead, a.uses_genrm, a.per_sequence, a.needs_ref(cfg), a.loss_units(cfg),
                          a.norm_by_std(cfg)]
out["tasks"] = [get_task(name).source for name in TASKS]
try:
    load_config("configs/default.yaml", ["trainer.stepz=3"])
except ConfigError as e:
    out["error"] = [type(e).__name__, str(e)]
sys.argv, err = ["train", "configs/default.yaml", "trainer.stepz=3"], io.StringIO()
with contextlib.redirect_stderr(err):
    try:
        runpy.run_module("reasonrl_fast.train", run_name="__main__")
    except SystemExit as e:
        out["exit"] = [e.code, err.getvalue()]
out["tried"] = tried
print(json.dumps(out))
"""


def test_settings_load_and_algorithms_answer_without_torch():
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["tried"] == [] and out["import"] == []
    shipped = sorted(glob.glob("configs/*.yaml", root_dir=ROOT))
    assert sorted(out["facts"]) == shipped and len(shipped) >= 8
    for path in shipped:  # what the memory planner reads of an algorithm, as it reads here
        cfg = load_config(os.path.join(ROOT, path))
        a = get_algo(cfg.algo)
        assert out["facts"][path] == [a.name, a.zhead, a.uses_genrm, a.per_sequence, a.needs_ref(cfg),
                                      a.loss_units(cfg), a.norm_by_std(cfg)], path
    assert out["tasks"] == ["addition", "code", "genrm_addition", "multiply", "partition"]
    kind, message = out["error"]
    assert kind == "ConfigError" and message.startswith("config key 'trainer.stepz'") and "\n" not in message
    code, stderr = out["exit"]
    assert code == 2 and stderr == f"error: {message}\n"
