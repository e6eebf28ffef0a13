"""The default math reward, except that its first call SIGKILLs one of this driver's Ray worker
actors (found among the driver's descendant processes): a rank dying between two steps."""

import os
import signal

from procs import children

from reasonrl_fast.trainer.reward import math_reward

_calls = 0


def _worker_actors() -> list[int]:
    kids, todo, found = children(), [os.getpid()], []
    while todo:
        for pid in kids.get(todo.pop(), []):
            todo.append(pid)
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().startswith(b"ray::Worker"):
                        found.append(pid)
            except OSError:
                pass
    return sorted(found)


def reward(response: str, answer: str) -> float:
    global _calls
    _calls += 1
    if _calls == 1:
        victims = _worker_actors()
        print(f"killing worker process {victims[-1]} of {victims}", flush=True)
        os.kill(victims[-1], signal.SIGKILL)
    return math_reward(response, answer)
