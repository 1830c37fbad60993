import json
import sys
import types

import pytest

from oncurve.errors import UserError
from oncurve.metrics import MetricsLogger, read_jsonl, truncate_after


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


def test_truncate_drops_a_row_cut_by_a_crash_and_ignores_missing_files(tmp_path):
    MetricsLogger(tmp_path).log(1, {"kl": 1.0})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "kl": 0.')
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]
    truncate_after(tmp_path, 5)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "kl": 1.0}\n'
    assert not (tmp_path / "samples.jsonl").exists()


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
        def __init__(self, log_dir):
            calls.append(("init", log_dir))

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
        ("init", str(tmp_path / "tensorboard")),
        ("kl", 0.5, 4),
        ("reward/mean", 2.0, 4),
        "flush",
        "close",
    ]
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["entropy"] is None


def test_real_tensorboard_event_files_hold_the_scalars(tmp_path):
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="the tb extra (tensorboard) is not installed",
    )
    logger = MetricsLogger(tmp_path, tensorboard=True)
    logger.log(1, {"kl": 0.25, "entropy": float("inf")})
    logger.log(2, {"kl": 0.5, "entropy": 1.5})
    logger.close()
    events = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["entropy", "kl"]
    assert [(e.step, e.value) for e in events.Scalars("kl")] == [(1, 0.25), (2, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("entropy")] == [(2, 1.5)]
