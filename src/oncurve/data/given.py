"""Datasets passed to `oncurve.train(train_dataset=..., eval_dataset=...)` as TRL's
`GRPOTrainer` takes them: a `datasets.Dataset` (or any object with a length that yields dict
rows), a list of dict rows, or an `IterableDataset` (`load_dataset(..., streaming=True)`, or
any iterable of dict rows without a length), of which `train` reads the rows the run needs
(`first_rows`).

The config names one as `data.path: given:train_dataset` or `eval.path: given:eval_dataset`, as
config.yaml records it; while `train` runs (`holding`), `oncurve.data.files.read_records` reads
its records here, and `load_rows` puts them through a file's reading and checks. Nothing here
imports `datasets`: a `Dataset` is told by what it has.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from oncurve.errors import UserError

# The arguments of `train` that take a dataset, and the setting that names each in the config
SETTINGS = {"train_dataset": "data.path", "eval_dataset": "eval.path"}
PREFIX = "given:"
# The datasets of the `train` call under way, by argument
_HELD: dict[str, Any] = {}
# Libraries whose tensors and arrays a row may hold when its dataset is formatted for them; their
# scalars that are numbers (NumPy's int64) read as those numbers
ARRAY_LIBRARIES = ("torch", "numpy", "jax", "jaxlib", "tensorflow")
# The formats of a `datasets.Dataset` (`set_format`, `with_transform`) whose rows hold Python
# values; the others make columns tensors, arrays or tables
PYTHON_FORMATS = (None, "python", "custom")


def given_path(argument: str) -> str:
    """How the config names the dataset passed as `argument`: `given:<argument>`."""
    return PREFIX + argument


def given_argument(path: str | None) -> str:
    """The argument of `train` whose dataset `path` names (`given:train_dataset` ->
    "train_dataset"); "" for a file, a Hub id or None."""
    argument = (path or "").removeprefix(PREFIX)
    return argument if path and path.startswith(PREFIX) and argument in SETTINGS else ""


def check_dataset(argument: str, dataset: Any) -> None:
    """A one-line error naming `argument` for what oncurve cannot train on: anything but an
    iterable of rows (a `DatasetDict` of splits, a dict of datasets, which TRL evaluates one by
    one, a pandas or polars `DataFrame`, whose iteration yields its column names, a string, one
    row), a `Dataset` formatted as tensors or arrays
    (`set_format("torch")`: a number's text would be `tensor(2)`), and a `Dataset` with an image
    column (of its `features`, at any depth: TRL's multimodal prompts)."""
    kind = type(dataset).__name__
    if not kind.endswith("DatasetDict") and _of_datasets(dataset):
        names = ", ".join(map(repr, dataset))
        raise UserError(
            f"{argument}: a dict of {len(dataset)} datasets ({names}), each of which TRL "
            f"evaluates; oncurve evaluates one held-out set: pass one, "
            f"{argument}={argument}[{next(iter(dataset))!r}]"
        )
    frame = kind.endswith("DataFrame")
    if frame or isinstance(dataset, str | bytes | Mapping) or not hasattr(dataset, "__iter__"):
        what_to_pass = ""
        if kind.endswith("DatasetDict"):
            what_to_pass = f": pass one split, {argument}=dataset[{next(iter(dataset), '')!r}]"
        if frame:
            library = type(dataset).__module__.split(".")[0]
            what_to_pass = f": pass {argument}=datasets.Dataset.from_{library}(frame)"
        raise UserError(
            f"{argument}: expected a datasets.Dataset or a list of dict rows, got {kind}"
            + what_to_pass
        )
    formatting = getattr(dataset, "format", None)
    format_type = formatting.get("type") if isinstance(formatting, Mapping) else None
    if format_type not in PYTHON_FORMATS:
        raise UserError(
            f"{argument}: formatted as {format_type!r} (set_format), its columns come as tensors, "
            f"arrays or tables; oncurve reads rows as stored: pass {argument}.with_format(None)"
        )
    features = getattr(dataset, "features", None)
    for name, feature in (features or {}).items():
        if _holds_images(feature):
            raise UserError(
                f"{argument}: column {name!r} holds a vision-language model's images, which "
                "oncurve does not train on (text-only models); drop the column to train on the "
                "text"
            )


def _of_datasets(value: Any) -> bool:
    """Whether `value` is a dict of datasets, as TRL's `eval_dataset` may be: each a `datasets`
    dataset or a list of rows (dicts, none of them a chat message, which a row's prompt holds)."""
    if not isinstance(value, Mapping) or not value:
        return False
    return all(
        hasattr(each, "column_names")
        or (
            isinstance(each, list | tuple)
            and bool(each)
            and all(isinstance(row, Mapping) and "role" not in row for row in each)
        )
        for each in value.values()
    )


def streams(dataset: Any) -> bool:
    """Whether `dataset` yields its rows one by one without a length, as an `IterableDataset`
    (`load_dataset(..., streaming=True)`) does: it may not end."""
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__len__")


class StreamedRows(list):
    """The rows `first_rows` read from a dataset that `streams`."""


def first_rows(dataset: Iterable[Any], count: int) -> StreamedRows:
    """The first `count` rows a dataset that `streams` yields, or all of them where it ends
    first: reading stops there, so an endless stream is read as far as a run needs. An
    `IterableDataset` starts again at each reading, so a resumed run given it again reads the
    same rows, where the stream yields the same ones each time."""
    return StreamedRows(itertools.islice(dataset, count))


def streamed(argument: str) -> bool:
    """Whether the dataset held (`holding`) as `argument` was read from a stream."""
    return isinstance(_HELD.get(argument), StreamedRows)


def _holds_images(feature: Any) -> bool:
    """Whether a `datasets` feature is an `Image`, or holds one (a list's, a struct's)."""
    if type(feature).__name__ == "Image":
        return True
    if isinstance(feature, Mapping):
        return any(_holds_images(inner) for inner in feature.values())
    if isinstance(feature, list | tuple):
        return any(_holds_images(inner) for inner in feature)
    inner = getattr(feature, "feature", None)  # `List`, `Sequence`, `LargeList`
    return inner is not None and _holds_images(inner)


@contextmanager
def holding(datasets: Mapping[str, Any]) -> Iterator[None]:
    """`datasets` (by argument of `train`) readable by `given_records` within the block."""
    _HELD.update(datasets)
    try:
        yield
    finally:
        for argument in datasets:
            _HELD.pop(argument, None)


def given_records(path: str) -> list[tuple[str, dict[str, Any]]]:
    """The records of the dataset `path` names (`given_argument`), each a copy of its row with
    its location ("row 3", counted from 1, as a Parquet file's); a one-line error where this
    process was not given it (a resumed run, `oncurve eval --run`), where a row is not a dict
    of named columns or holds a tensor or array (`ARRAY_LIBRARIES`: a stream formatted with
    `with_format("torch")`, which the dataset does not tell, or a transform's), or where there
    are none."""
    argument = given_argument(path)
    if argument not in _HELD:
        raise UserError(
            f"{SETTINGS[argument]} {path}: the {argument} passed to oncurve.train, which is not "
            f"given here; pass it again: oncurve.train(config, {argument}=...)"
        )
    records = []
    for number, row in enumerate(_HELD[argument], start=1):
        if not isinstance(row, Mapping):
            raise UserError(
                f"{argument} row {number}: expected a dict of columns, got {type(row).__name__}"
            )
        if unnamed := [key for key in row if not isinstance(key, str)]:
            raise UserError(f"{argument} row {number}: column {unnamed[0]!r} is not named by text")
        for column, value in row.items():
            kind = type(value)
            library = kind.__module__.split(".")[0]
            if library in ARRAY_LIBRARIES and not isinstance(value, numbers.Number):
                raise UserError(
                    f"{argument} row {number}: column {column!r} holds a {library} "
                    f"{kind.__name__} (rows formatted as tensors or arrays, with_format('torch') "
                    f"say); oncurve reads rows as stored: pass {argument}.with_format(None)"
                )
        # a copy: reading takes the prompt and answer columns out of a record
        records.append((f"row {number}", dict(row)))
    if not records:
        raise UserError(f"{argument}: empty, no rows")
    return records
