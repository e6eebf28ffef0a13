"""`python -m reasonrl_fast.merge RUN_DIR/checkpoint-N OUT_DIR [--trust-checkpoint]`

Turns a sharded torch.distributed.checkpoint into a Hugging Face model directory (runtime/merge.py
says what is written and which checkpoints are refused)."""

from __future__ import annotations

import argparse

from reasonrl_fast import cli
from reasonrl_fast.runtime.merge import check_checkpoint, merge

__all__ = ["check_checkpoint", "main", "merge"]


def main(argv=None):
    return cli.main(_main, argv)


def _main(argv: list[str]) -> str:
    p = argparse.ArgumentParser(
        prog="python -m reasonrl_fast.merge",
        description="Turn a trainer checkpoint into a Hugging Face model directory. A checkpoint is trusted "
                    "input, like any PyTorch checkpoint: its .metadata (torch.distributed.checkpoint) is a "
                    "pickle, and loading it can run code. Only merge checkpoints you or a trusted user wrote.")
    p.add_argument("checkpoint", help="RUN_DIR/checkpoint-N")
    p.add_argument("out_dir", help="where the Hugging Face model is written")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="load it even when other users could have written to it (group- or world-writable "
                        "files, another owner); by default such a checkpoint is refused")
    args = p.parse_args(argv)
    out = merge(args.checkpoint, args.out_dir, trust=args.trust_checkpoint)
    print(out)
    return out


if __name__ == "__main__":
    main()
