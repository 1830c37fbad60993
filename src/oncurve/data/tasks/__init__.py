"""Built-in procedural tasks: `get_task("arith" | "countdown" | "sums" | "code" | "gym:<name>")`."""

from __future__ import annotations

import importlib
from typing import Any

from oncurve.data.tasks.base import Task
from oncurve.errors import UserError

# name -> (module, class); imported on use so a task's dependencies load only when chosen
_TASKS = {
    "arith": ("oncurve.data.tasks.arith", "ArithTask"),
    "countdown": ("oncurve.data.tasks.countdown", "CountdownTask"),
    "sums": ("oncurve.data.tasks.sums", "SumsTask"),
    "code": ("oncurve.data.tasks.code", "CodeTask"),
}
_GYM_PREFIX = "gym:"


def task_names() -> list[str]:
    """Accepted task names; `gym:<dataset>` stands for any reasoning-gym dataset."""
    return [*_TASKS, f"{_GYM_PREFIX}<dataset>"]


def get_task(name: str, options: dict[str, Any] | None = None, *, given: str = "data.task") -> Task:
    """The built-in task called `name`, built with the keyword arguments `options`
    (`data.task_options`); an unknown name is a UserError naming where it was `given`."""
    if name.startswith(_GYM_PREFIX):
        from oncurve.data.tasks.gym import GymTask, UnknownDataset

        def make(dataset: str, **options: Any) -> Task:
            try:
                return GymTask(dataset, **options)
            except UnknownDataset as err:
                raise UserError(f"{given}: {err}") from None

        args = (name[len(_GYM_PREFIX) :],)
    elif name in _TASKS:
        module, cls = _TASKS[name]
        make, args = getattr(importlib.import_module(module), cls), ()
    else:
        raise UserError(f"{given}: unknown task {name!r}; choices: {', '.join(task_names())}")
    if not options:
        return make(*args)
    try:
        return make(*args, **options)
    except UserError:
        raise
    except (TypeError, ValueError) as err:
        raise UserError(f"data.task_options {options} do not fit task {name}: {err}") from None


__all__ = ["Task", "get_task", "task_names"]
