"""What the tests share: running a training, child processes, cached venvs of other projects,
fake checkpoints, misbehaving reward functions and servers. Nothing here is collected as a test."""
