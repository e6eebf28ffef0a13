"""`python -m reasonrl_fast.eval [config.yaml] model.path=DIR_OR_CHECKPOINT eval.files=[...] key=value ...`

Samples `eval.n` responses per prompt and reports mean@n, se@n, pass@k, maj@n per data source
(docs/eval.md). Bad input ends it with one line `error: ...` and exit status 2."""

from __future__ import annotations

from reasonrl_fast import cli
from reasonrl_fast.errors import UserError
from reasonrl_fast.trainer.config import load_config


def main(argv: list[str] | None = None) -> dict:
    return cli.main(_main, argv)


def _main(argv: list[str]) -> dict:
    path = argv[0] if argv and "=" not in argv[0] else None
    cfg = load_config(path, argv[1:] if path else argv)
    from reasonrl_fast.eval.generate import EvalWorkerError
    from reasonrl_fast.eval.run import run
    from reasonrl_fast.trainer.cluster import ClusterError

    try:
        return run(cfg)
    # an unreachable cluster, a worker that died, a missing model file: the message says why
    except (FileNotFoundError, ClusterError, EvalWorkerError) as e:
        raise UserError(str(e)) from None


if __name__ == "__main__":
    main()
