"""`benchmarks/gpu_vs_trl.py` and `harness.gpu_comparison` on the CPU, without training: its
prompts, what an oncurve run's metrics and log give, the trainers alternating, a row's figures
and section (both trainers, a failed run, a memory cap, the long workload), the long workload's
model ending at EOS, results/gpu_vs_trl.md rendered from its record, and `profile_step.py`'s
settings. The runs themselves need a GPU (`gpu_check.py`'s `trl` and `profile` stages)."""

from __future__ import annotations

import gpu_vs_trl
import profile_step
import torch
import transformers
from harness import comparison, tables
from harness import gpu_comparison as gpu
from harness.checkout import RESULTS
from harness.models import SHAPES, end_at_eos, qwen2_config


def test_the_word_problems_are_the_arith_tasks_sums():
    first, *rest = gpu.word_problems(16)
    assert first["prompt"].startswith("Maria runs a bakery. On Monday morning there were ")
    assert first["prompt"].endswith("give the final number as <answer>N</answer>.")
    a, b = (int(w) for w in first["prompt"].split() if w.isdigit())
    assert first["answer"] == str(a + b)
    assert rest[7]["prompt"].startswith("Tom runs a bakery.")  # the 9th: the next name
    assert gpu.word_problems(16) == [first, *rest]  # deterministic


def test_an_oncurve_runs_figures_come_from_its_metrics_and_memory_plan():
    rows = [
        {"time/step": 3.0 + step, "time/rollout": 1.0, "time/reward": 0.01,
         "time/reference": 0.5, "time/train": 1.5, "memory/gpu_peak_gb": 4.0 + step,
         "memory/rollout_peak_gb": 3.0, "length/mean": 256.0,
         "time/sampler_compile_total": 20.0, "time/sampler_capture_total": 1.0}
        for step in range(2)
    ]  # fmt: skip
    log = "memory plan: 8 rows; training 4.6, sampling 3.0 GiB; predicted peak 5.2 GiB\n"
    figures = gpu.oncurve_figures(rows, log)
    assert list(figures["phases"]) == ["generate", "reward", "reference", "train"]
    assert figures["gpu_peak_gb"] == 5.0 and figures["plan_gb"] == 5.2
    assert figures["phase_peaks_gb"] == {"sampling": 3.0}
    assert figures["plan_phases_gb"] == {"sampling": 3.0, "update": 4.6}
    assert figures["compile_capture_s"] == 21.0


def run(seconds: list[float], peak: float | None, ok: bool = True) -> dict:
    phases = {p: [s / 4 for s in seconds] for p in gpu.PHASES}
    figures = {"seconds": seconds, "phases": phases, "gpu_peak_gb": peak, "length": [256.0]}
    status = "finished" if ok else "OOM"
    return {**(figures if ok else {}), "smi_peak_gb": 7.0, "wall": 50.0, "ok": ok, "status": status}


def test_the_trainers_alternate_and_a_row_renders_both_with_targets_and_runs():
    done: list[int] = []
    runs = {"oncurve": [run([9.0, 3.0, 3.2], 5.0), run([9.0, 2.8], 5.5)],
            "TRL": [run([20.0, 8.0], 6.0), run([], None, ok=False)]}  # fmt: skip
    results = comparison.alternate(["oncurve", "TRL"], 2, lambda label, i: runs[label][i],
                                   lambda got: done.append(sum(map(len, got.values()))))  # fmt: skip
    assert results == runs and done == [1, 2, 3, 4]
    figures = gpu.figures(results)
    stats = figures["stats"]
    assert stats["oncurve"]["seconds"] == 3.0 and stats["oncurve"]["gpu_peak_gb"] == 5.5
    assert stats["TRL"]["seconds"] == 8.0  # the OOM run left out
    assert figures["ratios"]["seconds"] == 3.0 / 8.0
    assert figures["runs"]["TRL"][1] == {"status": "OOM", "ok": False, "smi_peak_gb": 7.0,
                                         "wall": 50.0}  # fmt: skip
    row = {"model": "qwen2.5-0.5b", "gpu_memory_gb": 16.0, "runs_per_trainer": 2,
           "prompt_tokens": 72.8, "gpu": "NVIDIA H200", "date": "2026-11-28", "commit": "abc",
           "command": "python benchmarks/gpu_vs_trl.py", "speed_target": gpu_vs_trl.SPEED_TARGET,
           "python_versions": {"oncurve": "torch 2", "TRL": "trl 1"},
           "settings": {"rollout.max_new_tokens": 256, "data.prompts_per_step": 8,
                        "rollout.group_size": 8, "run.steps": 3}, **figures}  # fmt: skip
    text = gpu.section(row)
    assert text.startswith("### qwen2.5-0.5b-256-16gib: 8 prompts x G=8, 256 tokens, 3 steps")
    assert "| oncurve / TRL | 0.38x |" in text and "| TRL | 8.000 | 2.000 |" in text
    assert (
        "| s/step <= 0.35x TRL's (target set at 256 tokens) | 3.00 vs 8.00 s | 0.38x, no |" in text
    )
    assert "| TRL fits in 16 GiB at 256 tokens | 1/2 runs finished (finished, OOM) | no |" in text
    assert "| TRL | 2 | OOM |  | n/a | 7.00 | 50 |" in text


def test_a_row_with_one_trainer_has_no_quotient_and_no_target():
    results = {"oncurve": [run([9.0, 3.0], 5.0)]}
    figures = gpu.figures(results)
    assert figures["ratios"] == {}
    row = {"model": "smoke", "gpu_memory_gb": None, "runs_per_trainer": 1, "prompt_tokens": 70.0,
           "gpu": "no GPU (CPU)", "date": "2026-11-28", "command": "x", "speed_target": 0.35,
           "python_versions": {"oncurve": "torch 2"},
           "settings": {"rollout.max_new_tokens": 16, "data.prompts_per_step": 8,
                        "rollout.group_size": 8, "run.steps": 2}, **figures}  # fmt: skip
    text = gpu.section(row)
    assert "oncurve / TRL" not in text
    assert "| none measurable | needs a run of each trainer | n/a |" in text


def test_the_committed_page_is_the_one_its_record_renders(monkeypatch, tmp_path):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    tables.render_page("gpu_vs_trl")
    assert (tmp_path / "gpu_vs_trl.md").read_text() == (RESULTS / "gpu_vs_trl.md").read_text()


def test_every_profiled_variant_is_a_setting_oncurve_knows():
    from oncurve.config import load_config

    for settings in profile_step.VARIANTS.values():
        load_config(None, settings)  # an unknown key or value raises UserError


def test_a_random_model_made_to_end_at_eos_samples_it_once_in_mean_length_tokens_everywhere():
    torch.manual_seed(0)
    config = qwen2_config(SHAPES["smoke"], 2000, max_position_embeddings=1024)
    model = transformers.Qwen2ForCausalLM(config)
    eos, ids = 1999, torch.randint(0, 1999, (4, 512))
    with torch.no_grad():
        before = model(ids).logits.softmax(-1)[..., eos]
    assert before.mean() * 16 < 0.05  # without it: about one token in the vocabulary's size
    end_at_eos(model, eos, 16)
    with torch.no_grad():
        probs = model(ids).logits.softmax(-1)  # [B, T, V]
    p = probs[..., eos]
    assert p.min() * 16 > 0.99 and p.max() * 16 < 1.01  # at every position, early and late
    others = probs[..., :eos] * (eos / (1 - 1 / 16))  # the rest stays about uniform
    assert others.min() > 0.99 and others.max() < 1.01
    with torch.no_grad():  # bf16, as build_model saves it: still within a few percent
        p = model.to(torch.bfloat16)(ids).logits.float().softmax(-1)[..., eos]
    assert 0.95 < p.mean() * 16 < 1.05


def test_a_long_workload_row_says_its_lengths_end_at_eos_and_holds_its_own_target():
    results = {"oncurve": [run([90.0, 40.0], 30.0)], "TRL": [run([300.0, 150.0], 31.0)]}
    row = {"model": "qwen2.5-1.5b", "gpu_memory_gb": None, "runs_per_trainer": 1,
           "prompt_tokens": 72.8, "gpu": "NVIDIA H100", "date": "2026-11-28", "command": "x",
           "speed_target": gpu_vs_trl.LONG_SPEED_TARGET, "workload": "long",
           "python_versions": {"oncurve": "torch 2", "TRL": "trl 1"},
           "settings": {"rollout.max_new_tokens": 4096, "rollout.min_new_tokens": 0,
                        "data.prompts_per_step": 16, "rollout.group_size": 8, "run.steps": 2},
           **gpu.figures(results)}  # fmt: skip
    text = gpu.section(row)
    assert text.startswith("### qwen2.5-1.5b-4096: 16 prompts x G=8, 4096 tokens, 2 steps")
    assert "completions ending at EOS, 4096 at most" in text
    assert "| s/step <= 0.3x TRL's | 40.00 vs 150.00 s | 0.27x, yes |" in text
    assert gpu.summary(row).startswith(
        "qwen2.5-1.5b, 4096 tokens: s/step 0.27x TRL's (target 0.3x)"
    )
