"""What the workers print reaches the console as it is (each line once per worker, named by the
worker), without transformers' progress bars or Ray's note about folding repeated lines: a local
instance started by `start_ray`, two actors that print the same line twice and run a
transformers bar."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.childproc import ROOT

pytestmark = pytest.mark.e2e  # starts Ray

_DRIVER = """
import os, sys, time
import ray
from reasonrl_fast.config import load_config
from reasonrl_fast.runtime.ray_cluster import start_ray, stop_ray


class Seen:  # the driver's console as it is written, to wait for the workers' lines
    def __init__(self, stream):
        self.stream, self.text = stream, ""

    def write(self, s):
        self.text += s
        return self.stream.write(s)

    def __getattr__(self, name):
        return getattr(self.stream, name)


sys.stdout, sys.stderr = Seen(sys.stdout), Seen(sys.stderr)

owned = start_ray(load_config(None, ["trainer.workers_per_node=2", "trainer.cpus_per_worker=1"]))

@ray.remote(num_cpus=1)
class Talker:
    def talk(self):
        from transformers.utils.logging import tqdm
        for _ in tqdm(range(3), desc="Loading weights"):
            time.sleep(0.05)
        for _ in range(2):  # Ray folds a line seen more than twice across workers
            print("the same line from every worker", flush=True)
        return os.getpid()

talkers = [Talker.remote() for _ in range(2)]
pids = ray.get([t.talk.remote() for t in talkers])
deadline = time.monotonic() + 60  # the workers' lines reach the driver asynchronously, later under load
while (sys.stdout.text + sys.stderr.text).count("the same line from every worker") < 4 and time.monotonic() < deadline:
    time.sleep(0.2)
time.sleep(1)  # a folding note, were there one, comes after the lines it folds
stop_ray(owned)
print("PIDS", *pids, flush=True)
"""


def test_workers_lines_reach_the_console_once_each_without_bars_or_dedup_notes():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_DEDUP_LOGS",
                                                            "HF_HUB_DISABLE_PROGRESS_BARS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    p = subprocess.run([sys.executable, "-c", _DRIVER], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=180)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    pids = p.stdout.split("PIDS", 1)[1].split()
    assert len(set(pids)) == 2, out[-3000:]
    for pid in pids:  # each worker's lines, named by their worker, none folded
        assert sum(f"pid={pid})" in line and "the same line from every worker" in line
                   for line in out.splitlines()) == 2, out[-3000:]
    assert "Loading weights" not in out, out[-3000:]
    assert "repeated" not in out and "deduplicates" not in out, out[-3000:]
