"""`python -m reasonrl_fast.train [config.yaml] key=value ...`

With no arguments: the embedded default (tiny Qwen2, character tokenizer, synthetic addition
task, cached supervised warm start, then FlowRL), which learns on a 2-core CPU in minutes.
Bad input (config, model context, data files, run directory, checkpoint) ends it with one line
`error: ...` and exit status 2, before any model or Ray starts where it can be known that early
(preflight.py holds those checks)."""

from __future__ import annotations

from reasonrl_fast import cli
from reasonrl_fast.config import load_argv


def main(argv: list[str] | None = None) -> dict:
    return cli.main(_main, argv)


def _main(argv: list[str]) -> dict:
    cfg = load_argv(argv)
    from reasonrl_fast.preflight import preflight

    preflight(cfg)  # before the trainer's imports, the warm start, the GenRM and Ray
    from reasonrl_fast.trainer.loop import run

    return run(cfg)


if __name__ == "__main__":
    main()
