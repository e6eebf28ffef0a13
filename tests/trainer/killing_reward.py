"""The default math reward, except that call number $REASONRL_KILL_AT_CALL SIGKILLs the process
that makes it (the trainer's driver): a hard crash in the middle of a step, for the resume test."""

import os
import signal

from reasonrl_fast.trainer.reward import math_reward

_calls = 0


def reward(response: str, answer: str) -> float:
    global _calls
    _calls += 1
    if _calls == int(os.environ.get("REASONRL_KILL_AT_CALL", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
    return math_reward(response, answer)
