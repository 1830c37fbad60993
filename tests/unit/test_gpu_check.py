"""`benchmarks/gpu_check.py` on the CPU: its stage runner (`harness.stages`), table and section
with fake children (one that passes, one that fails, one that runs out of time, one skipped),
and its stages' readers of the results the real stages write (`harness.gpu_stages`). The stages
themselves need a GPU (`make gpu-check`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import gpu_check
import pytest
from gpu_check import (
    DEFAULT_STAGES,
    LIMITS,
    SECOND_LIMIT,
    SECOND_STAGES,
    TOTAL_LIMIT,
    WORKLOAD_STAGES,
)
from harness import gpu_bundle, gpu_stages
from harness.gpu_stages import job_rows
from harness.stages import Outcome, Stage, run_stage, status, table, tails

from oncurve.run.memory_plan import MemoryPlan


def gpu_stage(name: str) -> Stage:
    """The stage `name` as `--stages` makes it."""
    args = type("Args", (), {"stages": [name], "time_scale": 1.0, "steps": None})
    (stage,) = gpu_check.stages(args)
    return stage


def workload_stage(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Stage:
    """The stage `name` as `--stages` makes it, writing under `tmp_path`, TRL at hand."""
    monkeypatch.setattr(gpu_stages, "WORK", tmp_path)
    monkeypatch.setattr(gpu_stages, "trl_at_hand", lambda: True)
    return gpu_stage(name)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def ends(pid: int) -> bool:
    """Whether `pid` ends (or is a zombie waiting for its reaper) within 10 s: a SIGKILL is
    delivered asynchronously."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return True
        if "State:\tZ" in status:
            return True
        time.sleep(0.05)
    return False


def test_failed_and_timed_out_stages_get_their_rows_and_log_tails(tmp_path):
    stale = tmp_path / "stale.json"
    stale.write_text("{}")
    grandchild = tmp_path / "grandchild.pid"
    sleeper = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(grandchild)!r}, 'w').write(str(p.pid)); print('waiting', flush=True); "
        "time.sleep(60)"
    )

    def unreadable(outcome: Outcome) -> list[list[str]]:
        raise ValueError("no results | a second line\nof the message")

    stages = [
        Stage(
            "good", "a passing stage", 30, lambda: python("print('fine')"),
            lambda o: [["stale output gone", str(not stale.exists())], ["second", "row"]],
            outputs=(stale,),
        ),
        Stage(
            "bad", "a failing stage", 30,
            lambda: python("import sys; print('the cause of the failure'); sys.exit(3)"),
            unreadable,
        ),
        Stage("slow", "a stage out of time", 2, lambda: python(sleeper), lambda o: []),
        Stage("trl", "a skipped stage", 30, lambda: "no TRL here", lambda o: []),
    ]  # fmt: skip
    reports = [run_stage(stage, {}, tmp_path / "logs", tmp_path) for stage in stages]
    good, bad, slow, skipped = reports
    assert status(good) == "passed" and "tail" not in good
    assert good["rows"] == [["stale output gone", "True"], ["second", "row"]]
    assert status(bad) == "failed (exit 3)"
    assert bad["rows"] == [
        ["results", "none readable (ValueError: no results | a second line\nof the message)"]
    ]
    assert status(slow) == "timed out at 2 s"
    assert ends(int(grandchild.read_text()))  # its whole process group was killed
    assert status(skipped) == "skipped" and skipped["rows"] == [["skipped", "no TRL here"]]
    assert json.loads(json.dumps(reports)) == reports  # a result row keeps them as they are

    rendered = table(reports)
    table_lines = rendered.splitlines()
    assert table_lines[0] == "| stage | status | s (limit) | check | result |"
    assert table_lines[2].startswith("| a passing stage | passed | ")
    assert table_lines[3] == "|  |  |  | second | row |"
    assert table_lines[4].startswith("| a failing stage | failed (exit 3) | ")
    assert table_lines[4].endswith(
        "| results | none readable (ValueError: no results \\| a second line of the message) |"
    )
    assert table_lines[5].startswith("| a stage out of time | timed out at 2 s | ")
    assert table_lines[5].endswith("| results | none |")
    assert table_lines[6] == "| a skipped stage | skipped |  | skipped | no TRL here |"
    text = tails(reports)
    assert "the cause of the failure" in text and "#### slow: timed out at 2 s" in text
    assert "#### good" not in text and "#### trl" not in text
    row = {"key": "GPU", "date": "2026-11-26 14:57", "machine": {"gpu": "1 x GPU"},
           "versions": {"torch": "2.11", "transformers": "5.17"}, "cuda": "13.0",
           "command": "python benchmarks/gpu_check.py", "stages": reports}  # fmt: skip
    section = gpu_check.section(row)
    assert section.startswith("## GPU\n\n2026-11-26 14:57, 1 x GPU, torch 2.11 (CUDA 13.0), ")
    assert rendered in section and section.endswith(f"### Log tails\n\n{text}")
    line = gpu_check.summary(row)
    assert "failed (exit 3)" in line and "timed out at 2 s" in line and "skipped" in line


def test_the_default_stages_fit_one_device_call_and_stages_picks_a_subset(monkeypatch, tmp_path):
    assert sum(LIMITS[name] for name in DEFAULT_STAGES) <= TOTAL_LIMIT - 10
    # the second call, and each of the others alone, in what a 15-minute session has left; a
    # workload takes one call of a session of its own
    assert sum(LIMITS[name] for name in SECOND_STAGES) <= SECOND_LIMIT
    others = set(LIMITS) - set(DEFAULT_STAGES) - set(SECOND_STAGES) - set(WORKLOAD_STAGES)
    assert others and all(LIMITS[name] <= SECOND_LIMIT for name in others)
    assert all(LIMITS[name] <= TOTAL_LIMIT - 10 for name in WORKLOAD_STAGES)
    parser_type = gpu_check.stage_names
    with pytest.raises(argparse.ArgumentTypeError, match="unknown stages"):
        parser_type("job,nope")
    args = type("Args", (), {"stages": parser_type("ppo,job"), "time_scale": 2.0, "steps": 5})
    chosen = gpu_check.stages(args)
    assert [s.name for s in chosen] == ["job", "ppo"]  # the order of LIMITS
    assert [s.limit for s in chosen] == [2 * LIMITS["job"], 2 * LIMITS["ppo"]]
    assert "run.steps=5" in chosen[0].command()
    monkeypatch.setattr(gpu_bundle, "GPU_BUNDLE", tmp_path)  # no wheels there
    monkeypatch.setattr(gpu_bundle.importlib.util, "find_spec", lambda name: None)
    assert "make gpu-bundle" in gpu_stage("trl").command()


def test_the_default_jobs_rows_from_its_metrics_and_memory_plan():
    plan = MemoryPlan(
        microbatch_rows=64, microbatch_tokens=4096, gradient_checkpointing=False,
        logprob_chunk_size=1024, state_bytes=2**28, train_peak_bytes=3 * 2**29,
        sample_peak_bytes=2**28, reference_peak_bytes=2**30, offload_reference=True,
        budget_bytes=80 * 2**30,
    )  # fmt: skip
    log = f"loading ...\n{plan.describe()}\nstep 1 ...\n"
    rows = [{"step": 0, "eval/accuracy": 0.25}]
    for step, (seconds, graphs) in enumerate([(9.0, 1.0), (0.2, 1.0), (0.4, 0.0)], start=1):
        rows.append({"step": step, "time/step": seconds, "rollout/graphs": graphs,
                     "rollout/compiled": 1.0, "memory/gpu_peak_gb": 0.5 + step / 10,
                     "memory/rollout_peak_gb": 0.2 + step / 10,
                     "memory/train_peak_gb": 0.5 + step / 10})  # fmt: skip
    rows[-1] |= {"time/sampler_compile_total": 21.9, "time/sampler_capture_total": 9.3}
    rows.append({"step": 3, "eval/accuracy": 0.5})
    config = {"run": {"steps": 150}, "model": {"pack_rows": True, "offload_reference": True}}
    got = dict(job_rows(rows, log, config))
    assert got["steps done"] == "3 of 150"
    assert got["held-out greedy accuracy before / after"] == "25.0% / 50.0%"
    assert got["s/step (median, first step left out)"] == "0.300"
    assert got["peak GPU memory (max `memory/gpu_peak_gb`)"] == "0.80 GiB"
    assert got["CUDA graphs (`rollout/graphs`)"] == "off at steps [3]"
    assert got["compiled decode step (`rollout/compiled`)"] == "every step"
    assert got["memory plan: predicted / measured peak"] == "1.5 / 0.80 GiB (+0.70 GiB)"
    assert got["reference on the GPU for its pass only (`model.offload_reference`)"] == "yes"
    # no reference pass logged (beta 0): its phase is left out
    assert got["peak by phase, measured / planned"] == (
        "sampling 0.50 / 0.20 GiB, update 0.80 / 1.50 GiB"  # the plan prints 0.1 GiB
    )
    spent = "sampler's compile + capture over the run (`time/sampler_*_total`)"
    assert got[spent] == "31.2 s (target <= 30 s: missed)"
    assert got["rows packed in the update (`model.pack_rows`)"] == "yes"
    config["model"]["pack_rows"] = False
    assert (
        dict(job_rows(rows, log, config))["rows packed in the update (`model.pack_rows`)"] == "no"
    )
    log += (
        "warning: rows stay padded in the update (model.pack_rows): torch's variable-length "
        "attention failed its check: RuntimeError: no kernel\n"
    )
    got = dict(job_rows(rows, log, config))
    assert got["rows packed in the update (`model.pack_rows`)"] == "no: RuntimeError: no kernel"


def test_the_readers_of_the_rollout_trl_and_ppo_results(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_stages, "WORK", tmp_path)
    outcome = Outcome(0, 1.0, 10, tmp_path / "log")
    (tmp_path / "rollout.json").write_text(json.dumps([
        {"scenario": "64x256", "sampler": "cuda_graph", "tokens": 16384, "best_s": 1.0,
         "tokens_per_s": 16384.0, "first_call_s": 3.5, "capture_s": 2.4, "vs_static": 1.1,
         "compile_s": 0.5},
        {"scenario": "64x256", "sampler": "model.generate (static cache)", "tokens": 16384,
         "best_s": 1.1, "tokens_per_s": 14894.5, "first_call_s": 24.8, "capture_s": None,
         "vs_static": 1.0},
    ]))  # fmt: skip
    assert gpu_stage("rollout").read(outcome) == [
        ["64x256 `cuda_graph`", "16,384 tokens/s (1.10x static generate); first call 3.5 s, "
         "compile 0.5 s, capture 2.4 s"],
        ["64x256 `model.generate (static cache)`", "14,894 tokens/s (1.00x static generate); "
         "first call 24.8 s"],
    ]  # fmt: skip
    phases = {"generation": 0.5, "reward": 0.01, "reference": 0.3, "train": 1.2}
    stats = {"oncurve": {"seconds": 2.0, "gpu_peak_gb": 4.0, "plan_gb": 5.2,
                         "compile_capture_s": 23.0, "phases": phases,
                         "phase_peaks_gb": {"sampling": 3.1, "reference": 4.0, "update": 3.9},
                         "plan_phases_gb": {"sampling": 3.0, "reference": 5.2, "update": 4.6}},
             "TRL": {"seconds": 8.0, "gpu_peak_gb": 5.0,
                     "phases": {"generation": 6.0, "reward": 0.0, "reference": 0.4, "train": 1.6}}}  # fmt: skip
    stats["oncurve"]["length"], stats["TRL"]["length"] = 250.0, 256.0
    (tmp_path / "trl.json").write_text(json.dumps({"stats": stats, "speed_target": 0.35}))
    speed, split, memory, lengths, plan, by_phase, spent = gpu_stage("trl").read(outcome)
    assert by_phase[1] == (
        "sampling 3.10 / 3.00 GiB, reference 4.00 / 5.20 GiB, update 3.90 / 4.60 GiB"
    )
    assert speed[1] == "2.00 / 8.00 s = 0.25x (target <= 0.35x: met)"
    assert split[1] == "generation 0.50 / 6.00, reference 0.30 / 0.40, train 1.20 / 1.60"
    assert memory[1] == "4.00 GiB / 5.00 GiB = 0.80x (target <= 1x: met)"
    assert lengths[1] == "250.0 / 256.0"
    assert plan[1] == "5.2 / 4.00 GiB (+1.20 GiB)"
    assert spent[1] == "23.0 s (target <= 30 s: met)"
    runs = {"GRPO": {"cuda": 4096.0, "plan_gb": 4.5}, "PPO": {"cuda": 8192.0, "plan_gb": None}}
    (tmp_path / "ppo.json").write_text(json.dumps({"pairs": [runs]}))
    ratio, grpo, ppo = gpu_stage("ppo").read(outcome)
    assert ratio[1] == "4.00 GiB / 8.00 GiB = 0.50x (the claim, 25-50% less than PPO: met)"
    assert grpo[1] == "4.5 / 4.00 GiB (+0.50 GiB)" and ppo[1] == "n/a / 8.00 GiB"
    # the stage's limit stopped PPO's run: GRPO's figures still come back
    (tmp_path / "ppo.json").write_text(json.dumps({"pairs": [{"GRPO": runs["GRPO"]}]}))
    missing, grpo = gpu_stage("ppo").read(outcome)
    assert missing == ["PPO", "its run did not finish (log below)"]
    assert grpo[1] == "4.5 / 4.00 GiB (+0.50 GiB)"
    stats["TRL"] = None  # TRL's run cut short: oncurve's plan still reported
    (tmp_path / "trl.json").write_text(json.dumps({"stats": stats, "speed_target": 0.35}))
    cut, plan, _, _ = gpu_stage("trl").read(outcome)
    assert cut == ["TRL", "its run failed or did not finish (log below)"]
    assert plan[1] == "5.2 / 4.00 GiB (+1.20 GiB)"
    outcome.log.write_text(
        "memory plan: 12 rows / 4,068 tokens per microbatch\nstep 3/3  reward 0.000\n"
        "memory plan: step 1: {'rollout': 2.9}\none microbatch: step 1: {'rollout': 1.7}\n"
        "memory plan: the last step's kernels ran 0.91 s of its 3.40 s\n"
    )
    phases, busy, ops = gpu_stage("profile").read(outcome)
    assert busy[1] == "memory plan: the last step's kernels ran 0.91 s of its 3.40 s"
    assert (
        phases[1]
        == "memory plan: step 1: {'rollout': 2.9}; one microbatch: step 1: {'rollout': 1.7}"
    )
    assert str(outcome.log) in ops[1]


def test_the_long_workload_stage_runs_gpu_vs_trl_long_and_holds_its_own_target(
    monkeypatch, tmp_path
):
    stage = workload_stage("long", monkeypatch, tmp_path)
    assert stage.limit == LIMITS["long"]
    assert stage.command()[-5:] == ["--long", "--runs", "1", "--json", str(tmp_path / "long.json")]
    ours = {
        "seconds": 40.0,
        "gpu_peak_gb": 30.0,
        "plan_gb": 33.0,
        "length": 1771.5,
        "phases": {"generation": 30.0, "reference": 3.0, "train": 7.0},
    }
    theirs = {"seconds": 150.0, "gpu_peak_gb": 31.0, "length": 1765.0,
              "phases": {"generation": 125.0, "reference": 5.0, "train": 20.0}}  # fmt: skip
    figures = {"stats": {"oncurve": ours, "TRL": theirs}, "speed_target": 0.3}
    (tmp_path / "long.json").write_text(json.dumps(figures))
    speed, split, memory, lengths, *_ = stage.read(Outcome(0, 1.0, 10, tmp_path / "log"))
    assert speed[1] == "40.00 / 150.00 s = 0.27x (target <= 0.3x: met)"
    assert split[1] == "generation 30.00 / 125.00, reference 3.00 / 5.00, train 7.00 / 20.00"
    assert memory[1] == "30.00 GiB / 31.00 GiB = 0.97x (target <= 1x: met)"
    assert lengths[1] == "1771.5 / 1765.0"
    figures["stats"]["oncurve"] = None  # oncurve's run failed: said so, nothing divided
    (tmp_path / "long.json").write_text(json.dumps(figures))
    assert stage.read(Outcome(1, 1.0, 10, tmp_path / "log")) == [
        ["oncurve", "its run failed or did not finish (log below)"]
    ]


def test_the_tests_stage_reports_the_tests_that_ended_when_pytest_was_stopped(
    monkeypatch, tmp_path
):
    monkeypatch.setattr(gpu_stages, "WORK", tmp_path)
    stage = gpu_stage("tests")
    assert "harness.pytest_outcomes" in stage.command()
    outcome = Outcome(None, 10.0, 10, tmp_path / "log")
    assert stage.read(outcome) == [["`pytest -m gpu`", "no test finished"]]
    lines = [
        {"test": "tests/gpu/test_gpu.py::test_a", "outcome": "passed"},
        {"test": "tests/gpu/test_gpu_paths.py::test_b[lora]", "outcome": "failed",
         "message": "AssertionError: 3 == 4", "detail": "E   assert 3 == 4\ntests/x.py:9: E"},
        {"test": "tests/gpu/test_gpu.py::test_c", "outcome": "skipped"},
        {"test": "tests/gpu/test_gpu.py::test_d", "outcome": "passed"},
    ]  # fmt: skip
    (tmp_path / "logs").mkdir()
    outcome.log.write_text("collected 4 items\n")
    (tmp_path / "logs" / "gpu-tests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary, failed = stage.read(outcome)
    assert summary[1] == (
        "2 passed, 1 failed, 1 skipped (pytest was stopped: the tests that finished before)"
    )
    assert failed == ["failed: `test_gpu_paths::test_b[lora]`", "AssertionError: 3 == 4"]
    # the failure's report goes into the stage's log, whose tail is printed after the table
    assert outcome.log.read_text().endswith(
        "--- test_gpu_paths::test_b[lora] ---\nE   assert 3 == 4\ntests/x.py:9: E\n"
    )
    (tmp_path / "gpu-tests.xml").write_text(  # pytest finished: its XML counts
        '<testsuites><testsuite><testcase classname="tests.test_gpu" name="test_a"/>'
        '<testcase classname="tests.test_gpu_paths" name="test_b[lora]">'
        '<failure message="assert 1 == 2">E assert 1 == 2</failure></testcase>'
        '<testcase classname="tests.test_gpu" name="test_c"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    summary, failed = stage.read(outcome)
    assert summary[1] == "1 passed, 1 failed, 1 skipped"
    assert failed == ["failed: `test_gpu_paths::test_b[lora]`", "assert 1 == 2"]


def test_the_curve_stage_reads_both_curves_and_times_oncurve_to_trls_final_accuracy(
    monkeypatch, tmp_path
):
    stage = workload_stage("curve", monkeypatch, tmp_path)
    assert stage.command()[-2:] == ["--json", str(tmp_path / "curve.json")]
    assert stage.command()[-3].endswith("gpu_curve.py")
    curves = {"oncurve": [[0.0, 0.2], [40.0, 0.45], [80.0, 0.6], [150.0, 0.7]],
              "TRL": [[0.0, 0.2], [90.0, 0.4], [150.0, 0.5]]}  # fmt: skip
    row = {"warm_accuracy": 0.2, "curves": curves, "trl_final": 0.5, "trl_seconds": 150.0,
           "reach_s": 80.0, "ratio": 80 / 150, "target": 0.5}  # fmt: skip
    (tmp_path / "curve.json").write_text(json.dumps(row))
    outcome = Outcome(0, 1.0, 10, tmp_path / "log")
    warm, ours, theirs, reached = stage.read(outcome)
    assert warm == ["warm start: held-out greedy accuracy", "20.0%"]
    assert ours[1] == "20.0% / 70.0% (3 checkpoints in 150 s of training)"
    assert theirs[1] == "20.0% / 50.0% (2 checkpoints in 150 s of training)"
    assert reached == ["oncurve's time to TRL's final 50.0% (target <= 0.5x)",
                       "80 s of TRL's 150 s = 0.53x: missed"]  # fmt: skip
    row |= {"reach_s": None, "ratio": None}  # oncurve never reached it
    (tmp_path / "curve.json").write_text(json.dumps(row))
    assert stage.read(outcome)[-1][1] == "never reached: missed"
    row |= {"trl_final": 0.2}  # TRL no better than the warm start
    (tmp_path / "curve.json").write_text(json.dumps(row))
    assert stage.read(outcome)[-1][1] == "TRL did not improve on the start: nothing to reach"
    del row["curves"]["TRL"]  # TRL's run failed: oncurve's curve still shown
    row |= {"trl_final": None, "trl_seconds": None}
    (tmp_path / "curve.json").write_text(json.dumps(row))
    *_, ours, failed = stage.read(outcome)
    assert ours[0] == "oncurve: held-out accuracy before / after"
    assert failed == ["TRL", "its run failed or did not run (log below)"]


def test_dry_run_lists_the_curve_stages_command_and_runs_nothing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(gpu_stages, "WORK", tmp_path)
    monkeypatch.setattr(gpu_stages, "trl_at_hand", lambda: True)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--stages", "curve", "--dry-run"])
    assert gpu_check.main() == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"curve (limit {LIMITS['curve']} s): ")
    assert line.endswith(f"gpu_curve.py --json {tmp_path / 'curve.json'}")
    assert list(tmp_path.iterdir()) == []  # nothing run, nothing written


def test_a_checks_summary_quotes_each_stages_headline_figures():
    job = {"name": "job", "code": 0, "seconds": 60, "limit": 90,
           "rows": [["steps done", "150 of 150"],
                    ["held-out greedy accuracy before / after", "36.6% / 68.4%"],
                    ["s/step (median, first step left out)", "0.197"]]}  # fmt: skip
    rollout = {"name": "rollout", "code": None, "seconds": 80, "limit": 80,
               "rows": [["64x256 `cuda_graph`", "31,867 tokens/s (2.41x static generate)"]]}  # fmt: skip
    trl = {"name": "trl", "code": None, "seconds": 160, "limit": 160,
           "rows": [["TRL", "its run failed or did not finish (log below)"],
                    ["memory plan: predicted / measured peak", "4.7 / 4.60 GiB (+0.10 GiB)"]]}  # fmt: skip
    assert gpu_check.summary({"stages": [job, rollout, trl]}) == (
        "job passed, held-out 36.6% / 68.4%, 0.197 s/step; rollout timed out at 80 s, "
        "`cuda_graph` 31,867 tokens/s (2.41x static generate); trl timed out at 160 s, TRL: its "
        "run failed or did not finish (log below)"
    )
