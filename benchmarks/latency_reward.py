"""A reward with a fixed latency, for bench_async.py's case of a step with a wait that uses none of
the trainer's cores (`data.reward_fn=benchmarks/latency_reward.py:scored_after_a_wait`): each call
sleeps $REASONRL_REWARD_LATENCY_S seconds, as a call to a remote reward service or judge waits,
then scores the sample as the default routing does."""

import os
import time

from reasonrl_fast.rewards.score import default_compute_score


def scored_after_a_wait(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(float(os.environ.get("REASONRL_REWARD_LATENCY_S", "0")))
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
