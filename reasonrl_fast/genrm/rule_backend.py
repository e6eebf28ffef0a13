"""The `rule:TASK` backend of the GenRM server: an embedded task's exact rule judge (tasks/), no
model. It reads the request written by `protocol.render` ("fapo" or "compact"), checks the steps
and answers like a model would, a line per step checked and then `\\boxed{k}`; its token counts
are characters."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reasonrl_fast.genrm.backends import backend_spec
from reasonrl_fast.protocol import Completion, Sampling, last_user_text, step_verdict
from reasonrl_fast.tasks import TASKS, get_task


class RuleBackend:
    """`rule:TASK`: the exact verdicts of an embedded task's rule judge (tasks/), characters
    counted as tokens. Judging runs in a worker thread: a request of several megabytes must not
    stop the event loop while it is read."""

    usage = "rule:TASK"
    loads_model = False
    templates = ("fapo", "compact")  # a "published" request has no step boundaries to check
    label = "the rule judge"

    @classmethod
    def from_spec(cls, arg: str, device: str, max_batch: int) -> "RuleBackend":
        return cls(arg)  # no model: the device and the batch size are not its

    def __init__(self, task: str = "addition") -> None:
        judge = get_task(task).rule_judge if task in TASKS else None
        if judge is None:
            known = [backend_spec("rule", name) for name in TASKS if get_task(name).rule_judge is not None]
            raise ValueError(f"no task {task!r} with a rule judge: the rule judges are {', '.join(known)}")
        self.default_name, self.judge = backend_spec("rule", task), judge
        self.executor = ThreadPoolExecutor(2, thread_name_prefix="genrm-judge")

    async def complete(self, messages: list[dict[str, str]], sampling: Sampling) -> Completion:
        text = last_user_text(messages)
        prompt_tokens = sum(len(m["content"]) for m in messages)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, _rule_completion, self.judge, text, sampling.max_tokens,
                                          prompt_tokens)

    def stats(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def _rule_completion(judge, text: str, max_tokens: int | None, prompt_tokens: int) -> Completion:
    answer, verdict, n = judge(text)
    # With no steps there is no index to name: step_verdict reads any box as None then.
    assert n == 0 or step_verdict(answer, n) == verdict, (answer, verdict)
    # Cut at max_tokens (characters here), it says so as a model server does: the client counts
    # an answer cut before its verdict apart (genrm/truncated).
    if max_tokens is not None and len(answer) > max_tokens:
        return Completion(answer[:max_tokens], "length", prompt_tokens, max_tokens)
    return Completion(answer, "stop", prompt_tokens, len(answer))
