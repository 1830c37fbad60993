"""Built-in procedural tasks: `get_task("arith" | "countdown" | "sums" | "gym:<dataset>")`."""

from __future__ import annotations

import importlib

from oncurve.errors import UserError
from oncurve.tasks.base import Task

# name -> (module, class); imported on use so a task's dependencies load only when chosen
_TASKS = {
    "arith": ("oncurve.tasks.arith", "ArithTask"),
    "countdown": ("oncurve.tasks.countdown", "CountdownTask"),
    "sums": ("oncurve.tasks.sums", "SumsTask"),
}
_GYM_PREFIX = "gym:"


def task_names() -> list[str]:
    """Accepted task names; `gym:<dataset>` stands for any reasoning-gym dataset."""
    return [*_TASKS, f"{_GYM_PREFIX}<dataset>"]


def get_task(name: str) -> Task:
    """The built-in task called `name`."""
    if name.startswith(_GYM_PREFIX):
        from oncurve.tasks.gym import GymTask

        return GymTask(name[len(_GYM_PREFIX) :])
    if name not in _TASKS:
        raise UserError(f"data.task: unknown task {name!r}; choices: {', '.join(task_names())}")
    module, cls = _TASKS[name]
    return getattr(importlib.import_module(module), cls)()


__all__ = ["Task", "get_task", "task_names"]
