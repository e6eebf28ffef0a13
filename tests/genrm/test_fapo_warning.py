"""FAPO's judge in the training loop says so on the console when a step's GenRM verdicts mostly
failed: those responses get no penalty, so the step ran as plain GRPO on them (before, the run
went on silently). The GenRM is a real rule server, or a port where nothing listens."""

from __future__ import annotations

import concurrent.futures
import socket

import pytest

from reasonrl_fast.tasks.addition import addition_steps, make_prompt
from reasonrl_fast.genrm.launch import launch
from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast.trainer.fapo import Judge

pytestmark = pytest.mark.proc  # a server process and real connections on loopback


def dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once it is closed


def step(judge: Judge, n: int = 4) -> tuple[dict, dict]:
    for i in range(n):
        a, b = 21 + i, 34 + i
        work, ans = addition_steps(a, b, 2)
        judge.submit(i, {"prompt": make_prompt(a, b), "answer": str(a + b), "data_source": "addition"},
                     f"{work} \\boxed{{{ans}}}")
    return judge.collect()


def make(address: str, *overrides: str) -> tuple[Judge, list[str]]:
    lines: list[str] = []
    cfg = load_config(None, ["algo=fapo", f"fapo.genrm.addresses=[{address}]", "fapo.genrm.max_retries=0",
                             "fapo.genrm.timeout_s=5", *overrides])
    return Judge(cfg, log=lines.append), lines


def test_a_step_whose_verdicts_fail_is_reported():
    judge, lines = make(dead_address())
    try:
        verdicts, metrics = step(judge)
    finally:
        judge.close()
    assert all(v.step is None for v in verdicts.values()) and metrics["genrm/failures"] == 4
    (line,) = lines
    assert "[fapo] warning: 4 of 4 GenRM verdicts failed" in line and "connection" in line, line
    assert "plain GRPO" in line and "fapo.genrm.warn_failure_rate=0.5" in line


def test_no_warning_when_verdicts_arrive_or_when_turned_off():
    with launch("rule:addition") as server:
        judge, lines = make(server.url)
        try:
            verdicts, _ = step(judge)
        finally:
            judge.close()
    assert [v.step for v in verdicts.values()] == [-1] * 4 and lines == []
    judge, lines = make(dead_address(), "fapo.genrm.warn_failure_rate=1")
    try:
        step(judge)
    finally:
        judge.close()
    assert lines == []


@pytest.mark.parametrize("override", ["fapo.genrm.warn_failure_rate=1.5", "fapo.genrm.max_reply_bytes=0"])
def test_bad_settings_fail_before_a_server_starts(override):
    with pytest.raises(ConfigError, match="must be") as e:  # the config's words; the key and value named
        make(dead_address(), override)
    assert override in str(e.value)


def test_a_verdict_that_never_comes_is_a_failure_not_a_crash():
    """The driver's backstop wait: a future still open past it becomes a failed verdict."""
    judge, lines = make(dead_address())
    judge._pending[0] = concurrent.futures.Future()  # a request the client never answers
    judge._wait_s = 0.1
    try:
        verdicts, _ = judge.collect()
    finally:
        judge.close()
    assert verdicts[0].step is None and verdicts[0].error.startswith("no verdict: TimeoutError")
    assert len(lines) == 1 and "1 of 1" in lines[0]
