"""Scoring responses: math answers (math.py), programs run in a sandbox (code.py), a parallel
pool whose time limit really ends a hung scorer (pool.py), and routing by `data_source`.
Every scorer returns {"score": float, "acc": bool}: `score` is the reward, `acc` whether the
final answer is right (accuracy metrics come from `acc`, never from the reward)."""
