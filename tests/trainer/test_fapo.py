"""FAPO inside real runs: the trainer starts its own rule GenRM server (a real subprocess on a
loopback port) or uses one it is given, lowers the flagged right answers, fails open when the
server dies, and stops the server it started however the run ends."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from tests.helpers.train import ROOT, TINY, read_metrics, repo_env, run_train, sft_cache

from reasonrl_fast.genrm.launch import launch
from tests.helpers.procs import alive, interrupt, reaped

# Every response counts as right, so that every one goes to the GenRM even though the tiny test
# model cannot add yet; the rule judge flags the ones whose steps are wrong (nearly all of them).
pytestmark = pytest.mark.e2e  # every test here trains (some through their own Popen)

RIGHT = ["algo=fapo", "data.reward_fn=tests.helpers.faulty_rewards:always_right", "trainer.val_every=0"]


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
    p = run_train([*RIGHT, "trainer.steps=3", f"trainer.output_dir={out}", "trainer.val_every=3"], tmp_path)
    pid = _server_pid(p.stdout)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows[1:]:
        assert r["genrm/requests"] == 8 and r["genrm/failures"] == 0, r
        assert r["fapo/flagged_ratio"] > 0.5  # an untrained model's steps are wrong
        assert r["genrm/latency_p99_s"] > 0 and r["time/genrm_s"] > 0
        _check_shaping(r)
    # every algorithm reports it: validation answers are all "right", their steps mostly wrong
    assert rows[0]["val/flawed_positive_ratio"] > 0.5 and rows[-1]["val/flawed_positive_ratio"] > 0.5
    assert "genrm/requests" not in rows[0]  # validation asks no GenRM
    assert not alive(pid), "the GenRM server outlived the run"
    assert (out / "genrm_server.log").exists()


def _popen_train(args, tmp_path):
    env = repo_env()
    cmd = [sys.executable, "-m", "reasonrl_fast.train", *TINY, f"sft.cache_dir={sft_cache(tmp_path)}", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _rows(out) -> int:
    return len(read_metrics(out)) if (out / "metrics.jsonl").exists() else 0


def test_server_killed_and_restarted_mid_run(tmp_path):
    """The run finishes; the steps without a server count failures and penalise nothing."""
    out = tmp_path / "run"
    servers = [launch("rule:addition")]
    port = servers[0].port
    p = _popen_train([*RIGHT, "trainer.steps=14", f"trainer.output_dir={out}",
                      f"fapo.genrm.addresses=[127.0.0.1:{port}]", "fapo.genrm.timeout_s=2",
                      "fapo.genrm.max_retries=1", "fapo.genrm.cooldown_s=0.5"], tmp_path)
    try:
        deadline = time.monotonic() + 240
        while p.poll() is None and time.monotonic() < deadline:
            n = _rows(out)
            if n >= 2 and servers[0].alive():
                servers[0].kill()
            if n >= 5 and len(servers) == 1:  # same port: the run's address comes back
                # the run waits for it (a loaded machine starts a server slower than the run's
                # last steps go by), so that the steps after it have a server
                os.kill(p.pid, signal.SIGSTOP)
                try:
                    servers.append(launch("rule:addition", port=port))
                finally:
                    os.kill(p.pid, signal.SIGCONT)
            time.sleep(0.05)
        stdout, _ = p.communicate(timeout=60)
        assert p.returncode == 0, stdout[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for s in servers:
            s.stop()
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, 15))
    down = [r for r in rows if r["genrm/failures"] == r["genrm/requests"] > 0]
    assert down, [r["genrm/failures"] for r in rows]
    for r in down:  # no verdict, no penalty: every right answer keeps its +1
        assert r["fapo/flagged_ratio"] == 0 and r["reward/mean"] == pytest.approx(2 * r["accuracy/mean"] - 1)
    assert len(servers) == 2, "the run ended before the server came back"
    assert rows[-1]["genrm/failures"] == 0 and rows[-1]["fapo/flagged_ratio"] > 0
    for r in rows:
        _check_shaping(r)


def test_ctrl_c_stops_the_server(tmp_path):
    out = tmp_path / "run"
    with reaped(_popen_train([*RIGHT, "trainer.steps=500", f"trainer.output_dir={out}"], tmp_path)) as p:
        seen = ""
        for line in p.stdout:  # the run prints the server's pid once it is up
            seen += line
            if "GenRM server (" in line:
                break
        pid = _server_pid(seen)
        deadline = time.monotonic() + 180
        while not _rows(out) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive(pid)
        interrupt(p, 60)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), "the GenRM server outlived an interrupted run"


def test_a_genrm_that_cannot_start_fails_the_run_at_once(tmp_path):
    p = run_train(["algo=fapo", "trainer.steps=2", f"trainer.output_dir={tmp_path / 'run'}",
                   f"fapo.genrm.serve=hf:{tmp_path / 'no-such-model'}"], tmp_path, check=False, timeout=120)
    assert p.returncode != 0
    # one clear message, before any Ray process started: no traceback
    assert "error: GenRM server" in p.stderr and "no-such-model" in p.stderr, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and "Started a local Ray instance" not in p.stderr
