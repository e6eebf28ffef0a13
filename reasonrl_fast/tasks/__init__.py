"""The embedded tasks, by name (`data.task`) and by the `data_source` of their records
(tasks/base.py says what a task gives). A new task is one module defining its `TASK` and one
line here; config's `data.task` choices are these keys."""

from __future__ import annotations

from reasonrl_fast.data.records import problem_text
from reasonrl_fast.tasks import addition, code, genrm, partition
from reasonrl_fast.tasks.base import Task

TASKS: dict[str, Task] = {
    "addition": addition.TASK,
    "code": code.TASK,
    "genrm": genrm.TASK,
    "partition": partition.TASK,
}

_BY_SOURCE = {t.source: t for t in TASKS.values()}


def get_task(name: str) -> Task:
    """The task called `name`; a ValueError listing the known ones otherwise."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown task {name!r}: known tasks are {', '.join(TASKS)}") from None


def task_of(record: dict) -> Task | None:
    """The embedded task a record belongs to (by its data_source), or None."""
    return _BY_SOURCE.get(record.get("data_source"))


def genrm_request(record: dict, response: str) -> tuple[str, str, list[str]]:
    """(problem, reference answer, steps) of one GenRM request about `response` to `record`: the
    problem as written (not the chat-templated prompt the policy saw), and the response split
    into steps as its task does (a response without steps is one step)."""
    task = task_of(record)
    steps = (task.request_steps if task is not None else Task.request_steps)(response)
    return problem_text(record), str(record["answer"]), steps or [response]


__all__ = ["TASKS", "Task", "genrm_request", "get_task", "task_of"]
