"""FAPO inside real runs: the trainer starts its own rule GenRM server (a real subprocess on a
loopback port) or uses one it is given, lowers the flagged right answers, fails open when the
server dies, and stops the server it started however the run ends."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, TINY, read_metrics, run_train

from reasonrl_fast.genrm.serve import launch
from tests.procs import alive

# Every response counts as right, so that every one goes to the GenRM even though the tiny test
# model cannot add yet; the rule judge flags the ones whose steps are wrong (nearly all of them).
RIGHT = ["algo=fapo", "data.reward_fn=faulty_rewards:always_right", "trainer.val_every=0"]


def _server_pid(stdout: str) -> int:
    m = re.search(r"GenRM server \(rule:addition, pid (\d+)\) started at http://127\.0\.0\.1:\d+/v1", stdout)
    assert m, stdout[-2000:]
    return int(m.group(1))


def _check_shaping(r: dict) -> None:
    # +1 right, -1 wrong, 0 for a flagged right one (penalty 1), and every right one is sent
    acc = r["accuracy/mean"]
    assert r["fapo/sent"] == round(acc * 8)  # 4 prompts x 2 samples
    assert r["reward/mean"] == pytest.approx(2 * acc - 1 - acc * r["fapo/flagged_ratio"], abs=1e-6), r


def test_fapo_starts_and_stops_its_own_rule_server(tmp_path):
    out = tmp_path / "run"
    p = run_train([*RIGHT, "trainer.steps=3", f"trainer.output_dir={out}"], tmp_path)
    pid = _server_pid(p.stdout)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["genrm/requests"] == 8 and r["genrm/failures"] == 0, r
        assert r["fapo/flagged_ratio"] > 0.5  # an untrained model's steps are wrong
        assert r["genrm/latency_p99_s"] > 0 and r["time/genrm_s"] > 0
        _check_shaping(r)
    assert not alive(pid), "the GenRM server outlived the run"
    assert os.path.getsize(out / "genrm_server.log") >= 0


def test_validation_reports_the_flawed_positive_ratio(tmp_path):
    out = tmp_path / "run"
    run_train(["algo=grpo", "trainer.steps=1", f"trainer.output_dir={out}", "trainer.val_every=1",
               "data.reward_fn=faulty_rewards:always_right"], tmp_path)
    rows = read_metrics(out)
    # every validation answer is "right" and an untrained model's steps are wrong
    assert rows[0]["val/flawed_positive_ratio"] > 0.5
    assert "fapo/flagged_ratio" not in rows[1] and "genrm/requests" not in rows[1]


def test_server_killed_and_restarted_mid_run(tmp_path):
    """The run finishes; the steps without a server count failures and penalise nothing."""
    first = launch("rule:addition")
    port = first.port
    out = tmp_path / "run"
    state = {"restarted": None}

    def chaos():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            n = len(read_metrics(out)) if (out / "metrics.jsonl").exists() else 0
            if n >= 2 and alive(first.pid):
                first.kill()
            if n >= 5 and state["restarted"] is None:
                state["restarted"] = launch("rule:addition", port=port)
                return
            time.sleep(0.05)

    t = threading.Thread(target=chaos, daemon=True)
    t.start()
    try:
        run_train([*RIGHT, "trainer.steps=12", f"trainer.output_dir={out}",
                   f"fapo.genrm.addresses=[127.0.0.1:{port}]", "fapo.genrm.timeout_s=2",
                   "fapo.genrm.max_retries=1", "fapo.genrm.cooldown_s=0.5"], tmp_path)
        t.join(10)
    finally:
        first.stop()
        if state["restarted"] is not None:
            state["restarted"].stop()
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, 13))
    down = [r for r in rows if r["genrm/failures"] == r["genrm/requests"] > 0]
    assert down, [r["genrm/failures"] for r in rows]
    for r in down:  # no verdict, no penalty: every right answer keeps its +1
        assert r["fapo/flagged_ratio"] == 0 and r["reward/mean"] == pytest.approx(2 * r["accuracy/mean"] - 1)
    assert state["restarted"] is not None, "the run ended before the server came back"
    assert rows[-1]["genrm/failures"] == 0 and rows[-1]["fapo/flagged_ratio"] > 0
    for r in rows:
        _check_shaping(r)


def test_ctrl_c_stops_the_server(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests", "trainer")]))
    cmd = [sys.executable, "-m", "reasonrl_fast.train", *TINY, f"sft.cache_dir={tmp_path.parent / 'sft_cache'}",
           *RIGHT, "trainer.steps=500", f"trainer.output_dir={out}"]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = ""
        for line in p.stdout:  # the run prints the server's pid once it is up
            seen += line
            if "GenRM server (" in line:
                break
        pid = _server_pid(seen)
        deadline = time.monotonic() + 180
        while not ((out / "metrics.jsonl").exists() and read_metrics(out)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive(pid)
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), "the GenRM server outlived an interrupted run"


def test_a_genrm_that_cannot_start_fails_the_run_at_once(tmp_path):
    p = run_train(["algo=fapo", "trainer.steps=2", f"trainer.output_dir={tmp_path / 'run'}",
                   f"fapo.genrm.serve=hf:{tmp_path / 'no-such-model'}"], tmp_path, check=False, timeout=120)
    assert p.returncode != 0
    assert "no-such-model" in p.stderr[-3000:] and "Traceback" not in p.stderr[-3000:].split("Error")[-1]
