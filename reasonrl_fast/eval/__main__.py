"""`python -m reasonrl_fast.eval [config.yaml] model.path=DIR_OR_CHECKPOINT eval.files=[...] key=value ...`

Samples `eval.n` responses per prompt and reports mean@n, se@n, pass@k, maj@n per data source
(docs/eval.md)."""

from __future__ import annotations

import sys

from reasonrl_fast.trainer.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv and "=" not in argv[0] else None
    try:
        cfg = load_config(path, argv[1:] if path else argv)
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    from reasonrl_fast.eval.generate import EvalWorkerError
    from reasonrl_fast.eval.run import EvalError, run
    from reasonrl_fast.trainer.checkpoint import CheckpointError
    from reasonrl_fast.trainer.cluster import ClusterError

    try:
        return run(cfg)
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    # bad input, a refused checkpoint, an unreachable cluster, a worker that died: the message says why
    except (EvalError, CheckpointError, FileNotFoundError, ClusterError, EvalWorkerError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
