"""FAPO in the training loop: the GenRM judge of correct training responses
(docs/math.md §FAPO rewards).

The driver submits each correct response of a worker's shard as soon as that shard is scored,
while the other workers still generate; `collect` waits for the step's verdicts. The client
fails open: a request left without a usable verdict (server down, too slow, unparseable, cut at
max_tokens: genrm/truncated) penalises nothing and is counted in genrm/failures. With no
`fapo.genrm.addresses`, the run starts our server (`fapo.genrm.serve`, the rule judge by default)
on a free loopback port and stops it when the run ends, however it ends.
"""

from __future__ import annotations

import os
import time
from collections import Counter

from reasonrl_fast.errors import ConfigError
from reasonrl_fast.genrm.client import GenRMClient, Verdict, failure_kind
from reasonrl_fast.tasks import genrm_request, get_task, task_of


def template_for(cfg) -> str:
    g = cfg.fapo.genrm
    if g.template != "auto":
        return g.template
    embedded = cfg.embedded_model and cfg.embedded_task
    return get_task(cfg.data.task).genrm_template if embedded else "fapo"


class Judge:
    def __init__(self, cfg, log=print):
        g = cfg.fapo.genrm
        self.server = None
        addresses = list(g.addresses)
        if not addresses:
            from reasonrl_fast.genrm.launch import launch

            log_path = os.path.join(cfg.trainer.output_dir, "genrm_server.log")
            self.server = launch(g.serve, api_key=g.api_key or None, log_path=log_path)
            addresses = [self.server.url]
            log(f"[fapo] GenRM server ({g.serve}, pid {self.server.pid}) started at {self.server.url}; "
                f"its log: {log_path}")
        try:
            self.client = GenRMClient(addresses, model=g.model, api_key=g.api_key, template=template_for(cfg),
                                      timeout_s=g.timeout_s, max_retries=g.max_retries, max_tokens=g.max_tokens,
                                      temperature=g.temperature, top_p=g.top_p, max_concurrency=g.max_concurrency,
                                      cooldown_s=g.cooldown_s, max_reply_bytes=g.max_reply_bytes)
        except ValueError as e:  # settings the client refuses (credentials in an address and an
            # api_key both): one line naming them, its address already without the credentials
            self.close()
            raise ConfigError(f"fapo.genrm: {e}") from None
        except BaseException:
            self.close()
            raise
        self._log, self._warn_rate, self._max_tokens = log, g.warn_failure_rate, g.max_tokens
        self._pending: dict[int, object] = {}
        self._truth: dict[int, int] = {}  # the step checker's index, where the task has one
        self._first_submit = 0.0
        # The client bounds every request (attempts x timeout + backoff); this is only a backstop
        # so that no bug of ours can hold the step for ever.
        self._wait_s = (g.max_retries + 1) * (g.timeout_s + 5.0) + 30.0

    def submit(self, index: int, item: dict, response: str) -> None:
        """Ask about sample `index` (a correct training response)."""
        if not self._pending:
            self._first_submit = time.perf_counter()
        self._pending[index] = self.client.submit(*genrm_request(item, response), solution=response)
        task = task_of(item)
        if task is not None and task.step_checker is not None:
            self._truth[index] = task.step_checker(item["prompt"], response)

    def collect(self) -> tuple[dict[int, Verdict], dict]:
        """The step's verdicts by sample index, and its fapo/genrm metrics. `time/genrm_s` runs
        from the first request to the last verdict; `time/genrm_wait_s` is the part the driver
        spent waiting after the last shard was scored (what the GenRM adds to the step)."""
        t = time.perf_counter()
        deadline = t + self._wait_s
        verdicts = {}
        for i, f in self._pending.items():
            try:
                verdicts[i] = f.result(timeout=max(0.0, deadline - time.perf_counter()))
            except Exception as e:  # noqa: BLE001 - fail open: no verdict, no penalty
                verdicts[i] = Verdict(step=None, error=f"no verdict: {e!r}", attempts=0,
                                      latency_s=time.perf_counter() - self._first_submit)
        now = time.perf_counter()
        sent = len(verdicts)
        flagged = sum(v.flawed for v in verdicts.values())
        metrics = {**self.client.metrics(),
                   "fapo/sent": sent,
                   "fapo/flagged_ratio": flagged / sent if sent else 0.0,
                   "time/genrm_s": now - self._first_submit if sent else 0.0,
                   "time/genrm_wait_s": now - t,
                   **self._agreement(verdicts)}
        self._pending, self._truth = {}, {}
        self._warn_failures(verdicts)
        return verdicts, metrics

    def _warn_failures(self, verdicts: dict[int, Verdict]) -> None:
        """One console line when too many of the step's verdicts failed: those responses got no
        penalty, so FAPO ran as plain GRPO on them, a run its user would want to stop. Answers cut
        at max_tokens are said apart: the fix is a setting, not the server."""
        failed = [v for v in verdicts.values() if v.step is None]
        if not verdicts or len(failed) / len(verdicts) <= self._warn_rate:
            return
        kinds = Counter(failure_kind(v.error) for v in failed).most_common(3)
        truncated = sum(v.truncated for v in failed)
        cut = (f" {truncated} of them reached fapo.genrm.max_tokens={self._max_tokens} before a verdict: "
               f"raise it (the published FAPO run asks for 16384)." if truncated else "")
        self._log(f"[fapo] warning: {len(failed)} of {len(verdicts)} GenRM verdicts failed this step "
                  f"({', '.join(f'{k}: {n}' for k, n in kinds)}); those responses get no FAPO penalty "
                  f"(plain GRPO).{cut} Check the GenRM server (warns above fapo.genrm.warn_failure_rate="
                  f"{self._warn_rate:g})")

    def _agreement(self, verdicts: dict[int, Verdict]) -> dict:
        """How the GenRM's usable verdicts compare with the step checker (embedded task only):
        the share that flag exactly the responses the checker finds flawed, and the share that
        name the checker's step. The rule judge scores 1 on both; a learned one is measured."""
        pairs = [(v.step, self._truth[i]) for i, v in verdicts.items() if v.step is not None and i in self._truth]
        if not pairs:
            return {}
        return {"genrm/checker_agreement": sum((s != -1) == (t != -1) for s, t in pairs) / len(pairs),
                "genrm/checker_step_agreement": sum(s == t for s, t in pairs) / len(pairs),
                "genrm/checker_judged": len(pairs)}

    def close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        if self.server is not None:
            self.server.stop()
            self.server = None
