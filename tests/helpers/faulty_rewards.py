"""Reward functions that misbehave on purpose, for the end-to-end tests
(`data.reward_fn=tests.helpers.faulty_rewards:NAME`). Each is the default math reward except as its docstring
says. They run in the reward pool's worker processes, whose parent is the trainer's driver;
each counts its own calls in its worker (the tests that count use `reward.num_workers=1`)."""

import collections
import os
import signal

# sleeps_forever_once: one home, with the benchmark that measures a step with a hung reward
from benchmarks.hang_reward import sleeps_forever_once  # noqa: F401
from reasonrl_fast.rewards.math import math_score as math_reward
from tests.helpers.procs import children

_calls: collections.Counter = collections.Counter()


def _call(name: str) -> int:
    _calls[name] += 1
    return _calls[name]


def raises_every_third(response: str, answer: str) -> float:
    """Raises on every third call: the sample scores 0 and is counted (`reward/errors`)."""
    if _call("raises") % 3 == 0:
        raise RuntimeError("flaky reward")
    return math_reward(response, answer)


def nan_or_inf(response: str, answer: str) -> float:
    """Every third call returns NaN and every fifth +inf (a reward model's overflow, a bad
    parse): the trainer must count them and keep training."""
    n = _call("nonfinite")
    if n % 3 == 0:
        return float("nan")
    if n % 5 == 0:
        return float("inf")
    return math_reward(response, answer)


def kills_the_driver(response: str, answer: str) -> float:
    """Call number $REASONRL_KILL_AT_CALL SIGKILLs the trainer's driver (this worker's parent):
    a hard crash in the middle of a step, for the resume test."""
    if _call("driver") == int(os.environ.get("REASONRL_KILL_AT_CALL", "0")):
        os.kill(os.getppid(), signal.SIGKILL)
    return math_reward(response, answer)


def _worker_actors(kind: bytes = b"ray::Worker") -> list[int]:
    """The pids of the driver's Ray actors of class `kind` (their process title)."""
    kids, todo, found = children(), [os.getppid()], []
    while todo:
        for pid in kids.get(todo.pop(), []):
            todo.append(pid)
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().startswith(kind):
                        found.append(pid)
            except OSError:
                pass
    return sorted(found)


def kills_a_worker(response: str, answer: str) -> float:
    """The first call SIGKILLs one of the driver's Ray worker actors (found among the driver's
    descendant processes): a rank dying mid-step (the first worker's share is scored while the
    other may still generate)."""
    if _call("worker") == 1:
        victims = _worker_actors()
        print(f"killing worker process {victims[-1]} of {victims}", flush=True)
        os.kill(victims[-1], signal.SIGKILL)
    return math_reward(response, answer)


def kills_a_rollout_worker(response: str, answer: str) -> float:
    """Split placement: the first call SIGKILLs the driver's rollout worker (its engine), while
    it may still generate the step ahead or take the weights."""
    if _call("rollout worker") == 1:
        victims = _worker_actors(b"ray::RolloutWorker")
        print(f"killing rollout worker process {victims[-1]} of {victims}", flush=True)
        os.kill(victims[-1], signal.SIGKILL)
    return math_reward(response, answer)


def always_right(response: str, answer: str) -> dict:
    """Every response is right (`acc`), so that each one goes to FAPO's GenRM even when the tiny
    test model cannot add yet."""
    return {"score": 1.0, "acc": True}


def records_responses(response: str, answer: str) -> float:
    """The math reward; every response it scores is appended, one JSON string a line, to
    $REASONRL_RESPONSES (the seed tests compare the samples of whole runs)."""
    import json

    with open(os.environ["REASONRL_RESPONSES"], "a") as f:
        f.write(json.dumps(response) + "\n")
    return math_reward(response, answer)


def right_by_checksum(response: str, answer: str) -> dict:
    """Right when the response's CRC-32 is odd: a fixed coin per response, so that a random
    policy's groups come out mixed or all alike by chance (dynamic sampling's filter keeps the
    first and drops the second) in a run that can be repeated."""
    import zlib

    right = bool(zlib.crc32(response.encode()) & 1)
    return {"score": 1.0 if right else -1.0, "acc": right}


def coin_then_kills_the_driver(response: str, answer: str) -> dict:
    """`right_by_checksum`'s coin, and call number $REASONRL_KILL_AT_CALL SIGKILLs the driver (as
    `kills_the_driver`): a crash in the middle of a step with dynamic sampling on."""
    if _call("coin driver") == int(os.environ.get("REASONRL_KILL_AT_CALL", "0")):
        os.kill(os.getppid(), signal.SIGKILL)
    return right_by_checksum(response, answer)
