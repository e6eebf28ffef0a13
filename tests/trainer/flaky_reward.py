"""A reward function that raises on every third call (used by the end-to-end test)."""

from reasonrl_fast.trainer.reward import math_reward

_calls = 0


def reward(response: str, answer: str) -> float:
    global _calls
    _calls += 1
    if _calls % 3 == 0:
        raise RuntimeError("flaky reward")
    return math_reward(response, answer)
