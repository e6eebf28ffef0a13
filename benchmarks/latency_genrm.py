"""A GenRM server whose every verdict comes a fixed time late, for bench_async.py's FAPO case of a
step with a wait that uses none of the trainer's cores: the embedded task's rule judge
(genrm/rule_backend.py) behind a sleep of $REASONRL_GENRM_LATENCY_S seconds per request, as a
remote GenRM's decoding takes. Requests in flight wait side by side, as a served model batches
them; the server is genrm/serve.py itself, its limits and protocol unchanged.

    REASONRL_GENRM_LATENCY_S=0.1 python benchmarks/latency_genrm.py [genrm.serve options]
"""

import asyncio
import os
import sys

import checkout  # noqa: F401  (this checkout's package)

from reasonrl_fast.genrm import serve
from reasonrl_fast.genrm.backends import BACKENDS
from reasonrl_fast.genrm.rule_backend import RuleBackend


class LateRuleBackend(RuleBackend):
    usage = "late:TASK"
    label = "the rule judge, answering late"

    async def complete(self, messages, sampling):
        await asyncio.sleep(float(os.environ.get("REASONRL_GENRM_LATENCY_S", "0")))
        return await super().complete(messages, sampling)


if __name__ == "__main__":
    BACKENDS["late"] = "__main__:LateRuleBackend"
    serve.main(["--backend", "late:addition", *sys.argv[1:]])
