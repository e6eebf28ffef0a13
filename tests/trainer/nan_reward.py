"""The default math reward, except that every third call returns NaN and every fifth +inf (a
reward model's overflow, a bad parse): the trainer must count them and keep training."""

from reasonrl_fast.trainer.reward import math_reward

_calls = 0


def reward(response: str, answer: str) -> float:
    global _calls
    _calls += 1
    if _calls % 3 == 0:
        return float("nan")
    if _calls % 5 == 0:
        return float("inf")
    return math_reward(response, answer)
