"""This checkout, first: every benchmark script imports this module before the package, and so runs
the reasonrl_fast of the checkout it sits in (and the in-place build of its ops), not another copy
installed in the environment. The scripts find this module, `harness` and `results_md` because
Python puts a script's own folder first on sys.path (the tests put it there to import them).

`child_env()` is the environment for a child interpreter (a benchmark's own runs, or the python
of another project's venv) that must import the same checkout. No heavy imports."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

if sys.path[:1] != [ROOT]:
    sys.path.insert(0, ROOT)


def child_env(**extra: str) -> dict[str, str]:
    """os.environ with this checkout first on PYTHONPATH, nothing fetched from the network (the
    models are local), and no tokenizer threads or usage reports beside the work measured."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0",
            **extra}
