"""Reward functions for the pool's tests; the sample's text says how to misbehave."""

import os
import random
import subprocess
import sys
import time


def behave(data_source, solution_str, ground_truth, extra_info=None):
    """'ok' -> right, 'hang' -> never returns, 'raise' -> raises, 'die' -> the process exits,
    'slow:<s>' -> sleeps s seconds, 'pid:<file>' -> writes its pid then hangs,
    'spawn:<file>' -> starts a long `sleep`, writes its pid, then hangs."""
    kind, _, arg = solution_str.partition(":")
    if kind == "hang":
        time.sleep(10**6)
    if kind == "raise":
        raise RuntimeError("a broken scorer")
    if kind == "die":
        os._exit(3)
    if kind == "slow":
        time.sleep(float(arg))
    if kind == "jitter":  # random latency, for the ordering test
        time.sleep(random.random() * 0.01)
    if kind in ("pid", "spawn"):
        pid = os.getpid()
        if kind == "spawn":
            pid = subprocess.Popen(["sleep", "1000"]).pid
        with open(arg + ".tmp", "w") as f:
            f.write(str(pid))
        os.replace(arg + ".tmp", arg)
        time.sleep(10**6)
    return {"score": float(ground_truth), "acc": float(ground_truth) > 0.5}


def two_args(response, answer):
    """The older reward signature."""
    return 0.25 if response == answer else 0.0


def returns_junk(data_source, solution_str, ground_truth, extra_info=None):
    return {"reward": 1.0} if solution_str == "dict" else "not a number"


def exits(data_source, solution_str, ground_truth, extra_info=None):
    sys.exit(1)
