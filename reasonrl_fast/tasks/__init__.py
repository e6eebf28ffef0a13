"""The embedded tasks, by name (`data.task`) and by the `data_source` of their records
(tasks/base.py says what a task gives). A new task is one module defining a `Task` subclass and
one line in the table (registry.py `TASKS`, re-exported here); config's `data.task` choices are
its keys.

The entries are "module:Class" paths, imported when a task is first asked for, as in
algos.ALGOS. A task with settings of its own declares them under `data.` (`section`,
`Settings`: tasks/partition.py's `data.partition.styles`). A task names its own scorer
(`Task.scorer`), and this registry hands each task's
data_source and scorer to the reward routing (rewards/score.py `add_routes`): the routing sits a
layer below the tasks and never imports them, so it is told; the reward pool passes what it was
told on to its worker processes."""

from __future__ import annotations

from reasonrl_fast.data.records import problem_text
from reasonrl_fast.protocol import split_steps
from reasonrl_fast.registry import TASKS
from reasonrl_fast.rewards.score import add_routes
from reasonrl_fast.tasks.base import Task


def get_task(name: str) -> Task:
    """The task called `name` (one instance per class path); a ValueError listing the known ones
    otherwise."""
    return TASKS.lookup(name)


def all_tasks() -> list[Task]:
    """Every registered task, in the order of TASKS."""
    return [get_task(name) for name in TASKS]


def task_of(record: dict) -> Task | None:
    """The embedded task a record belongs to (by its data_source), or None."""
    source = record.get("data_source")
    return next((t for t in all_tasks() if t.source == source), None)


def scorer_routes() -> dict[str, str]:
    """data_source -> scorer of every task's records (what the reward routing is told)."""
    return {t.source: t.scorer for t in all_tasks()}


# Asked when a record is first routed, not now: importing this package resolves no task.
add_routes(scorer_routes)


def genrm_request(record: dict, response: str) -> tuple[str, str, list[str]]:
    """(problem, reference answer, steps) of one GenRM request about `response` to `record`: the
    problem as written (not the chat-templated prompt the policy saw), and the response split
    into steps as its task does (a response without steps is one step)."""
    task = task_of(record)
    steps = (task.request_steps if task is not None else split_steps)(response)
    return problem_text(record), str(record["answer"]), steps or [response]


__all__ = ["TASKS", "Task", "all_tasks", "genrm_request", "get_task", "scorer_routes", "task_of"]
