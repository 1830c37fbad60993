import json
import os
import socket
import sqlite3
import struct
import sys
import time
import types
from pathlib import Path

import huggingface_hub
import pytest
from helpers.runs import run_files

from oncurve.config import load_config
from oncurve.errors import UserError
from oncurve.run.metrics import MetricsLogger, read_jsonl, start_trackers, truncate_after


def _log_steps(logger, steps, eval_every=3):
    for step in steps:
        logger.log(step, {"reward/mean": step / 10, "kl": 0.001 * step})
        logger.log_samples(step, [{"prompt": f"p{step}", "completion": "c", "reward": 1.0}])
        if step % eval_every == 0:
            logger.log(step, {"eval/accuracy": step / 100})


def test_rows_round_trip_and_are_on_disk_before_close(tmp_path):
    logger = MetricsLogger(tmp_path)
    logger.log(1, {"reward/mean": 0.1 + 0.2, "kl": float("nan"), "entropy": float("inf")})
    logger.log(2, {"reward/mean": 1e-12, "count": 3})
    logger.log_samples(2, [{"prompt": "é <b>", "completion": "x\ny", "reward": float("-inf")}])
    # Read while the logger is still open: nothing is held in a buffer.
    assert read_jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 1, "reward/mean": 0.1 + 0.2, "kl": None, "entropy": None},
        {"step": 2, "reward/mean": 1e-12, "count": 3.0},
    ]
    assert read_jsonl(tmp_path / "samples.jsonl") == [
        {"step": 2, "prompt": "é <b>", "completion": "x\ny", "reward": None}
    ]
    logger.close()


class Opaque:
    def __str__(self) -> str:
        return "opaque"


def test_sample_values_a_reward_logged_are_written_as_plain_json(tmp_path):
    """What `log_extra` gives (numpy and torch numbers and arrays, NaN inside a list, a string
    with a lone surrogate, a key or column name with one (JSON a model wrote, parsed), any
    other object) reaches samples.jsonl as JSON, not a crash."""
    import numpy as np
    import torch

    logger = MetricsLogger(tmp_path)
    logger.log_samples(1, [{
        "np": np.float32(0.5), "array": np.array([1, 2]), "tensor": torch.tensor([0.25]),
        "nested": {"a": [1.0, float("nan")], "b": (np.int64(3),)}, "text": "2\ud800",
        "object": Opaque(), "parsed": {"key\udc00": 1}, "column\ud800": 2,
    }])  # fmt: skip
    (row,) = read_jsonl(tmp_path / "samples.jsonl")
    assert row == {
        "step": 1, "np": 0.5, "array": [1, 2], "tensor": [0.25],
        "nested": {"a": [1.0, None], "b": [3]}, "text": "2\\ud800", "object": "opaque",
        "parsed": {"key\\udc00": 1}, "column\\ud800": 2,
    }  # fmt: skip


def test_a_metric_name_with_a_lone_surrogate_is_written_escaped(tmp_path):
    logger = MetricsLogger(tmp_path)
    logger.log(1, {"reward/a\ud800": 0.5})
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "reward/a\\ud800": 0.5}]


def test_non_number_metric_names_the_key(tmp_path):
    with pytest.raises(TypeError, match="metric 'kl' must be a number, got str"):
        MetricsLogger(tmp_path).log(1, {"kl": "high"})


def test_disabled_logger_writes_nothing(tmp_path):
    run = tmp_path / "run"
    logger = MetricsLogger(run, tensorboard=True, enabled=False)
    logger.log(1, {"kl": 1.0})
    logger.log_samples(1, [{"prompt": "p"}])
    logger.close()
    assert not run.exists()


def test_resume_after_truncate_gives_the_uninterrupted_files(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _log_steps(MetricsLogger(straight), range(1, 11))
    _log_steps(MetricsLogger(resumed), range(1, 8))  # crashed after step 7, checkpoint at 6
    # The trainer builds its logger before truncating: the logger must follow the new file.
    logger = MetricsLogger(resumed)
    truncate_after(resumed, 6)
    assert [r["step"] for r in read_jsonl(resumed / "metrics.jsonl")] == [1, 2, 3, 3, 4, 5, 6, 6]
    assert [r["step"] for r in read_jsonl(resumed / "samples.jsonl")] == [1, 2, 3, 4, 5, 6]
    _log_steps(logger, range(7, 11))
    for name in ("metrics.jsonl", "samples.jsonl"):
        assert (resumed / name).read_bytes() == (straight / name).read_bytes()
    assert sorted(p.name for p in resumed.iterdir()) == ["metrics.jsonl", "samples.jsonl"]


def test_a_metrics_file_that_cannot_be_rewritten_is_named(tmp_path, monkeypatch):
    _log_steps(MetricsLogger(tmp_path), range(1, 4))

    def refuse(source, target):
        raise PermissionError(1, "Operation not permitted", str(source))

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(UserError) as info:
        truncate_after(tmp_path, 2)
    assert str(info.value) == (
        f"{tmp_path / 'metrics.jsonl'}: cannot cut it back to step 2 for the resume "
        "(Operation not permitted)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "samples.jsonl"]


def test_truncate_can_drop_the_evaluation_of_the_step_it_keeps(tmp_path):
    """A run stopped during its final evaluation resumes at its last step and evaluates again:
    the first evaluation's row goes, the step's training row stays."""
    logger = MetricsLogger(tmp_path)
    _log_steps(logger, range(1, 4))  # an evaluation row at step 3
    truncate_after(tmp_path, 3, drop_evaluation=True)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["step"], "eval/accuracy" in r) for r in rows] == [(1, False), (2, False), (3, False)]
    assert [r["step"] for r in read_jsonl(tmp_path / "samples.jsonl")] == [1, 2, 3]


def test_truncate_drops_a_row_cut_by_a_crash_and_ignores_missing_files(tmp_path):
    MetricsLogger(tmp_path).log(1, {"kl": 1.0})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "kl": 0.')
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]
    truncate_after(tmp_path, 5)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "kl": 1.0}\n'
    assert not (tmp_path / "samples.jsonl").exists()


def test_a_row_cut_inside_a_character_by_a_full_disk_is_skipped_and_cut_away(tmp_path):
    """A full disk stops a write at any byte, inside a character's UTF-8 bytes too: the file
    reads, and a resume cuts it back, as with any cut row."""
    logger = MetricsLogger(tmp_path)
    logger.log_samples(1, [{"prompt": "p", "completion": "é"}])
    whole = (tmp_path / "samples.jsonl").read_bytes()
    with (tmp_path / "samples.jsonl").open("ab") as f:
        f.write('{"step": 2, "completion": "éé'.encode()[:-1])
    assert read_jsonl(tmp_path / "samples.jsonl") == [{"step": 1, "prompt": "p", "completion": "é"}]
    truncate_after(tmp_path, 2)
    assert (tmp_path / "samples.jsonl").read_bytes() == whole


def test_a_line_that_is_not_utf8_names_its_line_and_byte(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2, "x": "\xff"}\n')
    with pytest.raises(UserError) as info:
        read_jsonl(path)
    assert str(info.value) == f"{path}:2: not UTF-8 text (byte 18 of the line)"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json\n", "metrics.jsonl:2: not a JSON row"),
        ('{"kl": 1}\n', "metrics.jsonl:2: expected"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n' + line + '{"step": 3}\n')
    with pytest.raises(UserError, match=message):
        read_jsonl(path)


def test_missing_tensorboard_names_the_option(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(UserError, match=r"log\.tensorboard=true needs .*oncurve\[tb\]"):
        MetricsLogger(tmp_path, tensorboard=True)


def test_tensorboard_gets_every_finite_scalar(tmp_path, monkeypatch):
    calls = []

    class Writer:
        def __init__(self, log_dir, purge_step):
            calls.append(("init", log_dir, purge_step))

        def add_scalar(self, tag, value, global_step):
            calls.append((tag, value, global_step))

        def flush(self):
            calls.append("flush")

        def close(self):
            calls.append("close")

    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    logger = MetricsLogger(tmp_path, tensorboard=True)
    logger.log(4, {"kl": 0.5, "entropy": float("nan"), "reward/mean": 2})
    logger.close()
    assert calls == [
        ("init", str(tmp_path / "tensorboard"), 0),
        ("kl", 0.5, 4),
        ("reward/mean", 2.0, 4),
        "flush",
        "close",
    ]
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["entropy"] is None


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard's scalar dashboard reads from a run's event files: tag -> [(step,
    value)], after the purges a resume's events ask for."""
    from tensorboard.backend.event_processing.data_provider import MultiplexerDataProvider
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.context import RequestContext

    events = EventMultiplexer()
    events.AddRunsFromDirectory(str(log_dir))
    events.Reload()
    read = MultiplexerDataProvider(events, str(log_dir)).read_scalars(
        RequestContext(), experiment_id="", plugin_name="scalars", downsample=10_000
    )
    return {tag: [(d.step, d.value) for d in data] for tag, data in read.get(".", {}).items()}


@pytest.fixture
def read_tensorboard():
    """`tensorboard_scalars` (the test is skipped without the tb extra)."""
    pytest.importorskip("tensorboard", reason="the tb extra (tensorboard) is not installed")
    return tensorboard_scalars


def test_real_tensorboard_event_files_hold_the_scalars(tmp_path, read_tensorboard):
    logger = MetricsLogger(tmp_path, tensorboard=True)
    logger.log(1, {"kl": 0.25, "entropy": float("inf")})
    logger.log(2, {"kl": 0.5, "entropy": 1.5})
    logger.log(3, {"kl": 0.1 + 0.2})
    logger.close()
    scalars = read_tensorboard(tmp_path / "tensorboard")
    assert sorted(scalars) == ["entropy", "kl"]
    # 32-bit floats: TensorBoard's Rust data server (its default loader) drops 64-bit scalars
    assert scalars["kl"] == [
        (1, 0.25),
        (2, 0.5),
        (3, float(struct.unpack("f", struct.pack("f", 0.1 + 0.2))[0])),
    ]
    assert scalars["entropy"] == [(2, 1.5)]


def test_a_resumed_runs_tensorboard_events_hold_each_step_once(tmp_path, read_tensorboard):
    """A resume from step 1 of a run that logged 2: TensorBoard drops the first start's step
    2, as metrics.jsonl is cut there."""
    first = MetricsLogger(tmp_path, tensorboard=True)
    first.log(1, {"kl": 0.25})
    first.log(2, {"kl": 0.5})
    first.close()
    truncate_after(tmp_path, 1)
    resumed = MetricsLogger(tmp_path, tensorboard=True, start_step=1)
    resumed.log(2, {"kl": 0.75})
    resumed.log(3, {"kl": 1.0})
    resumed.close()
    scalars = read_tensorboard(tmp_path / "tensorboard")
    assert scalars["kl"] == [(1, 0.25), (2, 0.75), (3, 1.0)]


def test_a_finished_runs_resume_holds_its_final_evaluation_once(tmp_path, read_tensorboard):
    """A resume at a run's last step evaluates again: TensorBoard keeps the step's training
    scalars and only the new evaluation, as metrics.jsonl does."""
    first = MetricsLogger(tmp_path, tensorboard=True)
    first.log(1, {"kl": 0.25})
    first.log(2, {"kl": 0.5})
    first.log(2, {"eval/accuracy": 0.125})
    first.close()
    truncate_after(tmp_path, 2, drop_evaluation=True)
    resumed = MetricsLogger(tmp_path, tensorboard=True, start_step=2)
    resumed.log(2, {"eval/accuracy": 0.375})
    resumed.close()
    scalars = read_tensorboard(tmp_path / "tensorboard")
    assert scalars["kl"] == [(1, 0.25), (2, 0.5)]
    assert scalars["eval/accuracy"] == [(2, 0.375)]


def wandb_records(path: Path) -> list:
    """The protobuf records of a W&B `.wandb` file: LevelDB's log format (32 KiB blocks of
    records with a 7-byte header: checksum, length, kind 1 full / 2 first / 3 middle / 4 last)
    after a 7-byte file header."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 or pos + 7 + length > len(data):  # the end, or a record still being written
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def tracked_run(model_dir, data_file, run_dir, *tracker: str):
    """Two logged steps and an evaluation of the tiny model, with a tracker's settings."""
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"data.path={data_file}",
            f"eval.path={data_file}",
            "eval.num_prompts=4",
            "data.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=4",
            "reward.functions=[helpers.rewards_for_tests:count_digits]",
            "run.steps=2",
            f"run.dir={run_dir}",
            "run.device=cpu",
            *tracker,
        ],
    )


@pytest.mark.parametrize("offline_by", ["log.wandb.mode", "WANDB_MODE"])
def test_wandb_offline_gets_the_runs_config_and_every_metric(
    tiny_model_dir, data_file, tmp_path, monkeypatch, offline_by
):
    """Offline by the setting, or by W&B's own environment variable with the setting unset."""
    wandb = pytest.importorskip("wandb", reason="wandb (extra `wandb`) not installed")
    from oncurve.loop.trainer import train

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    wandb.teardown()  # W&B reads its environment once per process, at its first setup
    run_dir = tmp_path / "run"
    tracker = ["log.wandb.project=oncurve-test"]
    if offline_by == "WANDB_MODE":
        monkeypatch.setenv("WANDB_MODE", "offline")
    else:
        tracker.append("log.wandb.mode=offline")
    train(tracked_run(tiny_model_dir, data_file, run_dir, *tracker), quiet=True)
    # wandb's service process may still be writing the file when finish() returns (under load):
    # it is whole once it holds the run's exit record
    deadline, records = time.monotonic() + 30, []
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, sorted(p.name for p in run_dir.rglob("*"))
        time.sleep(0.1)
        found = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
        records = wandb_records(found[0]) if len(found) == 1 else []
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name) == ("oncurve-test", "run")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    mode = "offline" if offline_by == "log.wandb.mode" else None
    assert config["log"]["wandb"]["mode"] == mode and config["run"]["steps"] == 2
    logged = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            logged.setdefault(record.history.step.num, {}).update(items)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert sorted(logged) == [0, 1, 2]  # the evaluation before step 1, then steps 1 and 2
    for row in rows:
        for key, value in row.items():
            if key != "step" and value is not None:
                assert logged[row["step"]][key] == pytest.approx(value), key


def test_wandb_that_cannot_start_is_one_line(tmp_path, monkeypatch):
    """No API key in online mode: W&B's error, said in one line with what to do."""
    wandb = pytest.importorskip("wandb", reason="wandb (extra `wandb`) not installed")

    def refuse(**kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", refuse)
    settings = {"project": "p", "name": None, "mode": "online", "config": {}}
    with pytest.raises(UserError, match=r"^log.wandb.project p: W&B could not start \(No API key"):
        start_trackers(tmp_path, wandb=settings)


def test_a_tracker_that_cannot_start_leaves_the_run_an_overwrite_would_replace(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    wandb = pytest.importorskip("wandb", reason="wandb (extra `wandb`) not installed")
    from oncurve.loop.trainer import train

    run_dir = tmp_path / "run"
    train(tracked_run(tiny_model_dir, data_file, run_dir), quiet=True)
    before = run_files(run_dir)

    def refuse(**kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", refuse)
    tracker = ["run.overwrite=true", "log.wandb.project=p", "log.wandb.mode=online"]
    with pytest.raises(UserError, match="W&B could not start"):
        train(tracked_run(tiny_model_dir, data_file, run_dir, *tracker), quiet=True)
    assert run_files(run_dir) == before


def test_an_overwrite_deletes_the_previous_runs_tracker_files_and_keeps_the_new_ones(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    """The tracker starts before the previous run is deleted (so that one that cannot start
    deletes nothing): what it writes into the run's `wandb/` then is the new run's."""
    wandb = pytest.importorskip("wandb", reason="wandb (extra `wandb`) not installed")
    from oncurve.loop.trainer import train

    run_dir = tmp_path / "run"
    old = run_dir / "wandb" / "offline-run-old"
    old.mkdir(parents=True)
    (old / "run-old.wandb").write_bytes(b"old")
    (run_dir / "wandb" / "latest-run").symlink_to(old.name)
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "kl": 9.0}\n')

    def start(dir, **kwargs):
        new = Path(dir) / "wandb" / "offline-run-new"
        new.mkdir(parents=True)
        (new / "run-new.wandb").write_bytes(b"new")
        latest = Path(dir) / "wandb" / "latest-run"
        latest.unlink(missing_ok=True)
        latest.symlink_to(new.name)
        return types.SimpleNamespace(log=lambda scalars, step: None, finish=lambda: None)

    monkeypatch.setattr(wandb, "init", start)
    tracker = ["run.overwrite=true", "log.wandb.project=p", "log.wandb.mode=offline"]
    train(tracked_run(tiny_model_dir, data_file, run_dir, *tracker), quiet=True)
    assert sorted(p.name for p in (run_dir / "wandb").iterdir()) == [
        "latest-run", "offline-run-new"
    ]  # fmt: skip
    assert (run_dir / "wandb" / "latest-run").readlink() == Path("offline-run-new")
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2, 2]  # evaluations at start and end
    assert all(row.get("kl") != 9.0 for row in rows)


def test_wandb_without_its_package_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    settings = {"project": "p", "name": None, "mode": "offline", "config": {}}
    with pytest.raises(UserError, match=r"^log.wandb.project needs the wandb package: pip install"):
        start_trackers(tmp_path, wandb=settings)


@pytest.fixture
def offline_trackio(tmp_path, monkeypatch):
    """trackio imported afresh with TRACKIO_DIR = tmp_path/trackio (trackio reads it at import),
    local (no Space or server from the environment), the Hub offline for its user-name lookup,
    and every network connection refused and recorded in the list it yields with the module."""
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    for variable in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    connections = []

    def refuse(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            connections.append(address)
            raise OSError("this test makes no network connection")
        return connect(sock, address)

    connect = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", refuse)
    earlier = {n: m for n, m in sys.modules.items() if n == "trackio" or n.startswith("trackio.")}
    for name in earlier:
        del sys.modules[name]
    try:
        yield (
            pytest.importorskip("trackio", reason="trackio (extra `trackio`) not installed"),
            connections,
        )
    finally:
        for name in [n for n in sys.modules if n == "trackio" or n.startswith("trackio.")]:
            del sys.modules[name]
        sys.modules.update(earlier)


def test_trackio_gets_the_runs_config_and_every_metric(
    tiny_model_dir, data_file, tmp_path, offline_trackio, capfd
):
    from oncurve.loop.trainer import train

    trackio, connections = offline_trackio
    run_dir = tmp_path / "run"
    train(
        tracked_run(tiny_model_dir, data_file, run_dir, "log.trackio.project=oncurve-test"),
        quiet=True,
    )
    # trackio's own messages go to stderr: stdout is the command's summary
    assert capfd.readouterr().out == ""
    (run,) = trackio.Api().runs("oncurve-test")
    assert run.name == "run"
    assert run.config["log"]["trackio"]["project"] == "oncurve-test"
    assert run.config["run"]["steps"] == 2
    # trackio's API reads no metrics back: its database holds one JSON object per log call
    (database,) = (tmp_path / "trackio").glob("*.db")
    with sqlite3.connect(database) as db:
        stored = db.execute("SELECT run_name, step, metrics FROM metrics ORDER BY id").fetchall()
    logged, expected = {}, {}
    for name, step, metrics in stored:
        assert name == "run"
        logged.setdefault(step, {}).update(json.loads(metrics))
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        values = {k: v for k, v in row.items() if k != "step" and v is not None}
        expected.setdefault(row["step"], {}).update(values)
    assert sorted(logged) == [0, 1, 2]  # the evaluation before step 1, then steps 1 and 2
    assert logged == expected
    assert connections == []


def test_trackio_without_its_package_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trackio", None)
    settings = {"project": "p", "name": None, "config": {}}
    with pytest.raises(
        UserError, match=r"^log.trackio.project needs the trackio package: pip install"
    ):
        start_trackers(tmp_path, trackio=settings)
