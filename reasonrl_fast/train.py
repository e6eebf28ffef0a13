"""`python -m reasonrl_fast.train [config.yaml] key=value ...`

With no arguments: the embedded default (tiny Qwen2, character tokenizer, synthetic addition
task, cached supervised warm start, then FlowRL), which learns on a 2-core CPU in minutes."""

from __future__ import annotations

import sys

from reasonrl_fast.trainer.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv and "=" not in argv[0] else None
    overrides = argv[1:] if path else argv
    try:
        cfg = load_config(path, overrides)
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    from reasonrl_fast.genrm.launch import GenRMStartError
    from reasonrl_fast.trainer.checkpoint import CheckpointError
    from reasonrl_fast.trainer.loop import run

    try:
        return run(cfg)
    # a refused run directory or checkpoint, a GenRM server that cannot start: the message says why
    except (CheckpointError, GenRMStartError) as e:
        sys.exit(f"error: {e}")
    except ConfigError as e:  # found once the model is known (model.fused_lm_head)
        sys.exit(f"config error: {e}")


if __name__ == "__main__":
    main()
