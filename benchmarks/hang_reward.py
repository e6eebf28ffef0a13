"""A reward function that hangs once, for bench_rewards.py's training step with a reward that never
returns (`data.reward_fn=benchmarks/hang_reward.py:sleeps_forever_once`); the end-to-end test of the
pool's time limit uses it too (tests/helpers/faulty_rewards.py). Otherwise the default math reward."""

import os
import time

from reasonrl_fast.rewards.math import math_score


def sleeps_forever_once(response: str, answer: str) -> float:
    """One call in the whole run (across all the pool's workers and their replacements: the
    first to create the file $REASONRL_HANG_FLAG) never returns, like a parser stuck on
    degenerate output. The pool's time limit must end it and the run go on."""
    try:
        os.close(os.open(os.environ["REASONRL_HANG_FLAG"], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return math_score(response, answer)
    time.sleep(10**6)
