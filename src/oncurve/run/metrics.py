"""Per-step metrics and sample completions as JSON lines, optionally mirrored to TensorBoard,
Weights & Biases and trackio under the same names. TensorBoard holds each value as a 32-bit
float (its default loader reads no other scalars), W&B and trackio as logged.

`RUN/metrics.jsonl` holds one row per training step, {"step": 3, "reward/mean": 0.4, ...}, plus
rows of evaluation metrics ({"step": 10, "eval/accuracy": ...}) that share the step they follow.
`RUN/samples.jsonl` holds a few completions per step, {"step", "prompt", "completion", "reward",
"answer"}. JSON has no NaN or infinity: non-finite floats are written as `null`.

Every call opens, appends and closes the file, so a crash loses nothing already logged and a
file rewritten by `truncate_after` (resume) is the one the next row goes to.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from oncurve.errors import UserError
from oncurve.run.durable_files import replace_text
from oncurve.types import RolloutBatch

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
# The columns `log_samples` writes in each row of samples.jsonl of its own (`prompt_as_seen`
# with a tokenizer's `decode`), beside the columns rewards log.
SAMPLE_COLUMNS = frozenset(("step", "prompt", "completion", "reward", "answer", "prompt_as_seen"))


class MetricsLogger:
    """Appends metric rows to `run_dir/metrics.jsonl` and sample rows to `run_dir/samples.jsonl`.

    With `enabled=False` (ranks other than 0) every call does nothing and no file is created.
    """

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = False,
        enabled: bool = True,
        trackers: list[Any] | None = None,
        start_step: int = 0,
    ) -> None:
        """`trackers`: the runs `start_trackers` started, which get every row and are finished
        by `close`. `start_step`: the step a resumed run continues after; TensorBoard
        keeps what metrics.jsonl (cut there first) keeps: the events an earlier start wrote at
        later steps are dropped, and those of `start_step` are written again from the file (a
        resume at the last step drops that step's evaluation and evaluates again)."""
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self._writer = None
        # Runs of W&B-style trackers: each takes log(scalars, step=) and finish().
        self._trackers: list[Any] = list(trackers or [])
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            self._writer = _summary_writer(self.run_dir / "tensorboard", start_step)
            metrics = self.run_dir / METRICS_FILE
            if start_step and metrics.is_file():
                for row in iter_jsonl(metrics):
                    if row["step"] == start_step:
                        self._write_scalars(row)

    def log(self, step: int, values: dict[str, float]) -> None:
        """Append {"step": step, **values}; non-finite values become null, a name's lone
        surrogates escaped (as `json_value`'s)."""
        if not self.enabled:
            return
        row = {"step": int(step), **{_text(k): _finite(k, v) for k, v in values.items()}}
        _append(self.run_dir / METRICS_FILE, [row])
        if self._writer is not None:
            self._write_scalars(row)
        if self._trackers:
            scalars = {k: v for k, v in row.items() if k != "step" and v is not None}
            for tracker in self._trackers:
                tracker.log(scalars, step=row["step"])

    def _write_scalars(self, row: dict) -> None:
        for key, value in row.items():
            if key != "step" and value is not None:
                self._writer.add_scalar(key, value, global_step=row["step"])
        self._writer.flush()

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """Append one row per sample, {"step": step, **row}; non-finite floats become null."""
        if not self.enabled or not rows:
            return
        _append(
            self.run_dir / SAMPLES_FILE,
            [
                {"step": int(step), **{_text(k): json_value(v) for k, v in row.items()}}
                for row in rows
            ],
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        while self._trackers:
            with contextlib.redirect_stdout(sys.stderr):  # stdout is the command's summary
                self._trackers.pop().finish()


def read_jsonl(path: Path) -> list[dict]:
    """All rows of a JSON-lines file. A bad line raises UserError naming the file and line.

    A last line without its newline is a row still being written (or cut by a crash) and is
    skipped, so a report can read the files of a run in progress.
    """
    return list(iter_jsonl(path))


def iter_jsonl(path: Path) -> Iterator[dict]:
    """The rows of `read_jsonl` one at a time, for files too large to hold."""
    for _, row in _iter_lines(Path(path)):
        yield row


def truncate_after(run_dir: Path, step: int, drop_evaluation: bool = False) -> None:
    """Drop the rows with "step" > `step` from metrics.jsonl and samples.jsonl (atomic rewrite),
    and with `drop_evaluation` the evaluation's row (`eval/*`) of `step` itself.

    Resuming from the checkpoint of `step` then continues the files exactly where an
    uninterrupted run would be. Missing files are left missing.
    """
    for name in (METRICS_FILE, SAMPLES_FILE):
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        kept = [
            line
            for line, row in _iter_lines(path)
            if row["step"] < step
            or row["step"] == step
            and not (drop_evaluation and any(key.startswith("eval/") for key in row))
        ]
        try:
            _rewrite(path, kept)
        except OSError as err:
            raise UserError(
                f"{path}: cannot cut it back to step {step} for the resume ({err.strerror})"
            ) from None


def _rewrite(path: Path, lines: list[str]) -> None:
    """`path` holding `lines`, atomically (`replace_text`)."""
    replace_text(path, "".join(lines))


def _iter_lines(path: Path) -> Iterator[tuple[str, dict]]:
    """(line with its newline, parsed row) for every complete line; blank lines are skipped.
    A line is decoded on its own, so that a last line cut inside a character (a full disk)
    is skipped as any cut row is; a complete line that is not UTF-8 is a UserError naming it."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            cut = not raw.endswith(b"\n")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                if cut:
                    return
                raise UserError(
                    f"{path}:{number}: not UTF-8 text (byte {err.start} of the line)"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                if cut:
                    return
                raise UserError(f"{path}:{number}: not a JSON row ({err.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                if cut:
                    return
                raise UserError(f'{path}:{number}: expected an object with an integer "step"')
            yield (line + "\n" if cut else line, row)


def _append(path: Path, rows: list[dict]) -> None:
    text = "".join(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n" for row in rows)
    # One write per call: a row is either complete on disk or an unterminated last line.
    try:
        with path.open("a", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:  # a write's error names no file: say which
        raise OSError(err.errno, err.strerror, str(path)) from None


def _finite(key: str, value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"metric {key!r} must be a number, got {type(value).__name__}") from None
    return number if math.isfinite(number) else None


def json_value(value: Any) -> Any:
    """`value` as plain JSON: non-finite floats null, numpy and torch values as numbers and
    lists, a string's (and a key's) lone surrogates escaped (UTF-8 cannot hold them), any other
    object its `str`. A reward's `log_extra` may hand any of them."""
    if isinstance(value, bool | int | None):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return {_text(str(k)): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if hasattr(value, "tolist"):  # numpy and torch numbers and arrays
        return json_value(value.tolist())
    return str(value)


def _text(text: str) -> str:
    """`text` with its lone surrogates (what JSON a model wrote may decode to) as \\uNNNN."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def require_tensorboard() -> type:
    """torch's `SummaryWriter`; a UserError naming the extra when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UserError(
            "log.tensorboard=true needs the tensorboard package: pip install 'oncurve[tb]'"
        ) from None
    return SummaryWriter


def _summary_writer(log_dir: Path, start_step: int):
    # Every start marks its beginning (a SessionLog START at its step), a fresh one too:
    # TensorBoard's Python loader takes a run's first mark for its beginning and purges the
    # later steps at each mark after it, so without a first start's mark the events that it
    # wrote past a resume's step stay shown beside the resume's own.
    return require_tensorboard()(log_dir=str(log_dir), purge_step=start_step)


def start_trackers(
    run_dir: Path, wandb: dict[str, Any] | None = None, trackio: dict[str, Any] | None = None
) -> list[Any]:
    """The tracker runs for `MetricsLogger`: `wandb` holds `wandb.init`'s project, name (null:
    the run directory's), mode and config; `trackio` `trackio.init`'s project, name and config;
    None starts nothing there. One that cannot start is a UserError."""
    runs = []
    if wandb is not None:
        runs.append(_wandb_run(Path(run_dir), **wandb))
    if trackio is not None:
        runs.append(_trackio_run(Path(run_dir), **trackio))
    return runs


def _wandb_run(
    run_dir: Path, project: str, name: str | None, mode: str | None, config: dict
) -> Any:
    """A W&B run writing under `run_dir/wandb`; each start of a run (a resume too) is its own
    W&B run, named after the run directory unless `name` is given; `mode` None leaves it to
    W&B (WANDB_MODE, else online)."""
    try:
        import wandb
    except ImportError:
        raise UserError(
            "log.wandb.project needs the wandb package: pip install 'oncurve[wandb]'"
        ) from None
    try:
        chosen = {} if mode is None else {"mode": mode}
        return wandb.init(
            project=project, name=name or run_dir.name, dir=str(run_dir), config=config, **chosen
        )
    except wandb.errors.Error as err:  # no API key, no network in online mode: W&B's words
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"log.wandb.project {project}: W&B could not start ({why}); log in (wandb login), "
            "or set log.wandb.mode=offline"
        ) from None


def _trackio_run(run_dir: Path, project: str, name: str | None, config: dict) -> Any:
    """Start trackio's run and return the trackio module, which logs to and finishes it (trackio
    keeps one current run per process). The run lives in trackio's own directory (TRACKIO_DIR,
    by default under the Hugging Face cache) where `trackio show` finds it; each start of a run
    (a resume too) is its own trackio run, named after the run directory unless `name` is given."""
    try:
        import trackio
    except ImportError:
        raise UserError(
            "log.trackio.project needs the trackio package: pip install 'oncurve[trackio]'"
        ) from None
    # embed=False: no dashboard server, even in a notebook; `trackio show` opens one on demand.
    # Its messages go to stderr: stdout is the command's summary.
    with contextlib.redirect_stdout(sys.stderr):
        trackio.init(project=project, name=name or run_dir.name, config=config, embed=False)
    return trackio


def log_samples(
    logger: MetricsLogger,
    step: int,
    rollout: RolloutBatch,
    rewards: torch.Tensor,
    rows: list[dict],
    count: int,
    decode: Callable[[list[int]], str] | None = None,
    extra: dict[str, list[Any]] | None = None,
) -> None:
    """Write `count` of the step's completions, spread evenly over its `[N]` rows, with their
    prompt (`rows` holds one dataset row per group), reward and reference answer; with
    `decode` (the tokenizer's), also the prompt as the model saw it (`prompt_as_seen`: after
    the system prompt and chat template), so that a formatting mistake shows; with `extra`
    (column -> N values: what rewards logged with `log_extra`, none of `SAMPLE_COLUMNS`), each
    column's value beside its completion."""
    count = min(count, rollout.num_rows)
    if not count:
        return
    group_size = rollout.group_size
    picks = torch.linspace(0, rollout.num_rows - 1, count).long().tolist()
    samples = [
        {
            "prompt": rows[i // group_size]["prompt"],
            "completion": rollout.texts[i],
            "reward": float(rewards[i]),
            "answer": rows[i // group_size].get("answer"),
            **({"prompt_as_seen": decode(rows[i // group_size]["prompt_ids"])} if decode else {}),
        }
        for i in picks
    ]
    for sample, i in zip(samples, picks, strict=True):
        for column, values in (extra or {}).items():
            sample.setdefault(column, values[i])
    logger.log_samples(step, samples)
