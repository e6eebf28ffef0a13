"""The platform the trainer, the eval command, merge and the benchmarks stand on: the Ray runtime
(ray_cluster.py: start/stop, cluster checks, collecting actor calls; reaper.py), checkpoints
(checkpoint/: save, trust and integrity checks, resume) and the run's datasets (datasets.py:
the embedded tasks' splits or record files, and the seeded sampler)."""
