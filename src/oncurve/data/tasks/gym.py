"""reasoning-gym adapter (optional extra `gym`): any of its procedural datasets as a task whose
reward is the dataset's own `score_answer` on the completion's `<answer>...</answer>`."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from oncurve.data.tasks.base import TooFewProblems, hash_split
from oncurve.errors import UserError
from oncurve.rewards.extraction import extract_answer
from oncurve.rewards.registry import RewardFn

INSTRUCTION = "\n\nThink step by step, then give only the final answer in <answer> </answer> tags."
# reasoning-gym builds item i from a generator seeded by (seed, i), so `size` only bounds the
# indices we may visit; it costs nothing.
_MAX_INDEX = 10**9


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise UserError(
            "data.task=gym:...: reasoning-gym is not installed (pip install 'oncurve[gym]')"
        ) from None
    return reasoning_gym


class UnknownDataset(UserError):
    """A `gym:` name that reasoning-gym has no dataset of (`get_task` says where it was given)."""


class GymTask:
    """The reasoning-gym dataset `dataset` (e.g. "basic_arithmetic", "leg_counting"), with
    `config` its dataset settings (a ValueError where reasoning-gym refuses them). Where
    reasoning-gym has a curriculum for the dataset, it is a `LeveledTask`: level k sets every
    attribute of that curriculum to its level k (or its hardest), over `config`; `levels` is 0
    where there is none.

    Rows: "prompt" (the question and an answer-tag instruction), "answer", and "gym_entry"
    (the item itself, which `score_answer` reads). Train and test come from one seeded stream
    split by a hash of the question, so they never share a question.
    """

    def __init__(self, dataset: str, **config: Any) -> None:
        rg = _reasoning_gym()
        names = sorted(rg.factory.DATASETS)
        if dataset not in names:
            raise UnknownDataset(
                f"unknown reasoning-gym dataset {dataset!r}; choices: {', '.join(names)}"
            )
        self.name = f"gym:{dataset}"
        self.dataset_name = dataset
        self.config = config
        try:
            self._scorer = rg.create_dataset(dataset, seed=0, size=1, **config)
        except AssertionError as err:
            # reasoning-gym checks a dataset's settings with `assert`; `get_task` names
            # data.task_options in a ValueError's message
            raise ValueError(
                str(err) or "reasoning-gym's check of the dataset's settings failed"
            ) from None
        self._curriculum = (
            rg.factory.create_curriculum(dataset) if rg.factory.has_curriculum(dataset) else None
        )
        self.levels = (
            max(len(a.levels) for a in self._curriculum.attributes.values())
            if self._curriculum is not None
            else 0
        )

    def examples(
        self, split: str, n: int, seed: int, level: int | None = None
    ) -> list[dict[str, Any]]:
        if split not in ("train", "test"):
            raise ValueError(f"{self.name}: split must be 'train' or 'test', got {split!r}")
        data = _reasoning_gym().create_dataset(
            self.dataset_name, seed=seed, size=_MAX_INDEX, **self._level_config(level)
        )
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        failed: list[tuple[int, Exception]] = []
        budget = 50 * n + 1000
        for index in range(budget):
            if len(rows) == n:
                break
            try:
                entry = data[index]
            except Exception as exc:  # a generator's bug on a rare item (a division by zero)
                failed.append((index, exc))
                continue
            question = entry["question"]
            if hash_split(question) == split and not (split == "test" and question in seen):
                seen.add(question)
                rows.append(
                    {
                        "prompt": entry["question"].rstrip() + INSTRUCTION,
                        "answer": str(entry["answer"]),
                        "gym_entry": entry,
                    }
                )
        if failed:
            index, exc = failed[0]
            warnings.warn(
                f"{self.name}: reasoning-gym could not make {len(failed)} of the items drawn "
                f"(item {index}: {type(exc).__name__}: {exc}); they are skipped",
                RuntimeWarning,
                stacklevel=2,
            )
        if len(rows) < n:
            why = f"{self.name}: found only {len(rows)} {split} examples in {budget} items"
            if split == "test":
                raise TooFewProblems(why, rows)
            raise UserError(why)
        return rows

    def reward_fns(self) -> dict[str, RewardFn]:
        return {"correct": self.score}

    def _level_config(self, level: int | None) -> dict[str, Any]:
        """The dataset settings of difficulty `level`: `config` with the curriculum's level
        applied to each of its attributes; `config` itself for None."""
        if level is None:
            return self.config
        if not 0 <= level < self.levels:
            raise ValueError(f"{self.name}: level must be in [0, {self.levels}), got {level}")
        self._curriculum.set_global_level(level)
        settings = self._curriculum.generate_configuration(self.config)
        return {
            f.name: getattr(settings, f.name)
            for f in dataclasses.fields(settings)
            if f.name not in ("seed", "size")
        }

    def score(
        self, prompts: list[str], completions: list[str], *, gym_entry: list[dict], **columns: Any
    ) -> list[float | None]:
        """The dataset's `score_answer` on each completion's `<answer>` tag, as a float. An
        untagged completion is handed to `score_answer` as None, which reasoning-gym's datasets
        score 0.0: scored wrong, not unscored."""
        return [
            float(self._scorer.score_answer(extract_answer(completion, "tags"), entry))
            for completion, entry in zip(completions, gym_entry, strict=True)
        ]
