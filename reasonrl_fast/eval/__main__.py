"""`python -m reasonrl_fast.eval [config.yaml] model.path=DIR_OR_CHECKPOINT eval.files=[...] key=value ...`

Samples `eval.n` responses per prompt and reports mean@n, se@n, pass@k, maj@n per data source
(docs/eval.md). Bad input ends it with one line `error: ...` and exit status 2."""

from __future__ import annotations

from reasonrl_fast import cli
from reasonrl_fast.config import load_argv


def main(argv: list[str] | None = None) -> dict:
    return cli.main(_main, argv)


def _main(argv: list[str]) -> dict:
    cfg = load_argv(argv)
    from reasonrl_fast.eval.run import run

    return run(cfg)


if __name__ == "__main__":
    main()
