"""A reward function that raises on some samples (used by the end-to-end test)."""

from reasonrl_fast.trainer.reward import math_reward


def reward(response: str, answer: str) -> float:
    if "1" in response[:3]:  # some samples, not all
        raise RuntimeError("flaky reward")
    return math_reward(response, answer)
