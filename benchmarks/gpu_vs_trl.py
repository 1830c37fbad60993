"""oncurve against TRL's GRPOTrainer (no vLLM) on one GPU, the same GRPO job
(`harness.spec.Job`): seconds per step and per phase and peak GPU memory, on a random
Qwen2.5-0.5B-shaped model with the real Qwen3 tokenizer. 8 word problems a step (the arith
task's operands and answers in a chat prompt) x G=8 completions forced to `--tokens`, beta
0.04, lr 1e-6 constant, bf16; oncurve's memory settings its defaults, TRL's 8 rows a microbatch.
The trainers alternate, each run a fresh process; a failed run (OOM) is recorded as such.

    .venv/bin/python benchmarks/gpu_vs_trl.py --prepare      # here: tokenizer, prompts, model
    .venv/bin/python benchmarks/gpu_vs_trl.py --smoke        # here: 2-layer model, CPU, 16 tokens
    python3 benchmarks/gpu_vs_trl.py                         # GPU machine: 256 tokens
    python3 benchmarks/gpu_vs_trl.py --tokens 1024 --gpu-memory-gb 16
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from harness.checkout import CACHE, GPU_BUNDLE, checkout_env
from harness.children import GpuMemoryPeak, train_oncurve
from harness.machine import gpu_name, interpreter_versions
from harness.models import TOKENIZER, build_model, tokenizer_dir
from harness.records import context
from harness.run_logs import (
    measured_phase_peaks_gb,
    planned_peak_gb,
    planned_phase_peaks_gb,
    sampler_setup_seconds,
    step_phases,
)
from harness.spec import Job, chat_text
from harness.tables import cell, markdown_table, publish
from harness.trl_env import run_trl, trl_env, trl_versions

WORK = CACHE / "gpu_vs_trl"
PROMPTS_FILE = WORK / "prompts.jsonl"
SPEED_TARGET = 0.35  # issue 39: oncurve's s/step <= 0.35x TRL's at 256 tokens
PHASES = ("generate", "reward", "reference", "train")
TITLE = (
    "oncurve vs TRL's GRPOTrainer on one GPU\n\n"
    "Written by `benchmarks/gpu_vs_trl.py`, one section per completion length and memory cap."
)
NAMES = ("Maria", "Tom", "Aisha", "Kenji", "Lena", "Omar", "Priya", "Diego")
STOCK = (("bakery", "loaves of bread"), ("bookshop", "books"), ("farm shop", "eggs"),
         ("toy store", "marbles"), ("garden centre", "seed packets"), ("library", "magazines"),
         ("cafe", "cups"), ("hardware store", "screws"))  # fmt: skip
PROBLEM = (
    "{name} runs a {place}. On Monday morning there were {a} {item} in the storeroom, and "
    "in the afternoon a delivery brought {b} more {item}. How many {item} are in the "
    "storeroom now? Think step by step, then give the final number as <answer>N</answer>."
)


def prepare(model: str, tokenizer_source: str | None) -> Path:
    """The tokenizer in the cache, `PROMPTS_FILE` (512 word problems on the arith task's train
    rows, so that its `correct` reward scores them; rewritten, it is deterministic) and the
    model; returns the model's directory."""
    import transformers

    from oncurve.data.tasks import get_task

    tokenizer_path = tokenizer_dir(tokenizer_source)
    rows = []
    for i, row in enumerate(get_task("arith").examples("train", 512, seed=0)):
        a, b = (int(x) for x in row["prompt"].rstrip("=").split("+"))
        place, item = STOCK[i % len(STOCK)]
        name = NAMES[i // len(STOCK) % len(NAMES)]
        text = PROBLEM.format(name=name, place=place, item=item, a=a, b=b)
        rows.append({"prompt": text, "answer": row["answer"]})
    WORK.mkdir(parents=True, exist_ok=True)
    PROMPTS_FILE.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path)
    lengths = [len(tokenizer(text=chat_text(tokenizer, r["prompt"]))["input_ids"]) for r in rows]
    print(f"{len(rows)} prompts in {PROMPTS_FILE}, {statistics.mean(lengths):.1f} tokens on "
          f"average with the chat template ({min(lengths)}-{max(lengths)})", flush=True)  # fmt: skip
    return build_model(model, tokenizer_path)


def make_job(args: argparse.Namespace, model: str) -> Job:
    """The job both trainers run, its model prepared."""
    tokens = args.tokens or (16 if args.smoke else 256)
    rewards = [{"name": f"{fn.__module__}:{fn.__qualname__}", "weight": w}
               for _, fn, w in Job({}).rewards()]  # fmt: skip
    settings = {
        "run.device": "cpu" if args.smoke else "cuda",
        "model.path": str(prepare(model, args.tokenizer)),
        "data.path": str(PROMPTS_FILE),
        "data.chat_template": True,
        "reward.functions": json.dumps(rewards),
        "data.prompts_per_step": 8,
        "rollout.group_size": 8,
        "rollout.max_new_tokens": tokens,
        "rollout.min_new_tokens": tokens,
        "rollout.temperature": 1.0,
        "algo.preset": "grpo",
        "algo.beta": 0.04,
        "algo.mu": 1,
        "optim.lr": 1e-6,
        "optim.warmup_steps": 0,
        "eval.at_start_end": False,
        "log.samples_per_step": 0,
        "run.steps": args.steps or (2 if args.smoke else 5 if tokens <= 256 else 3),
        "run.seed": 0,
    }
    # TRL's own default per_device_train_batch_size: 8 rows a forward/backward
    return Job(settings, trl_microbatch=8, gpu_memory_gb=args.gpu_memory_gb)


def oncurve_figures(rows: list[dict], log: str) -> dict[str, Any]:
    """What a finished oncurve run logged: per-step seconds and phases, peak GPU memory
    (measured and planned, by phase), lengths, the sampler's compile and capture seconds."""
    phases = step_phases(rows)
    phases["generate"] = phases.pop("rollout")
    peaks = [r["memory/gpu_peak_gb"] for r in rows if r.get("memory/gpu_peak_gb") is not None]
    return {
        "seconds": [r["time/step"] for r in rows],
        "phases": {p: phases[p] for p in PHASES if p in phases},
        "gpu_peak_gb": max(peaks, default=None),
        "phase_peaks_gb": measured_phase_peaks_gb(rows),
        "plan_gb": planned_peak_gb(log),
        "plan_phases_gb": planned_phase_peaks_gb(log),
        "length": [r["length/mean"] for r in rows],
        "compile_capture_s": sampler_setup_seconds(rows[-1]),
    }


def run_trainer(label: str, job: Job, out: Path, python: str, env: dict[str, str]) -> dict:
    """One run of `label` (oncurve or TRL) in a fresh process: its status, wall seconds and
    nvidia-smi's peak, and when it finished its figures (`oncurve_figures`, or TRL's seconds,
    phases, peak GPU memory and lengths)."""
    with GpuMemoryPeak() as smi:
        if label == "oncurve":
            log = out / "log.txt"
            done = train_oncurve(job.oncurve_args(), out / "run", log, env, python, check=False)
            if not done["code"]:
                done |= oncurve_figures(done.pop("rows"), log.read_text())
            for folder in ("checkpoints", "final"):  # GBs a run
                shutil.rmtree(out / "run" / folder, ignore_errors=True)
        else:
            done = run_trl(job, out, python, env, check=False)
            log = Path(done.pop("log"))
    keep = ("seconds", "phases", "gpu_peak_gb", "length", "wall", "phase_peaks_gb", "plan_gb",
            "plan_phases_gb", "compile_capture_s")  # fmt: skip
    result = {k: done[k] for k in keep if k in done} | {"smi_peak_gb": smi.peak_gb}
    result["ok"] = not done["code"]
    text = log.read_text(errors="replace")
    result["status"] = "finished" if result["ok"] else (
        "OOM" if "out of memory" in text.lower() else f"failed ({done['code']})")  # fmt: skip
    if not result["ok"]:
        print(f"  {label} {result['status']}; log: {log}\n{text[-1500:]}", flush=True)
    return result


def benchmark(args: argparse.Namespace) -> tuple[str, dict]:
    """Run the trainers alternately; returns (section key, the row's figures)."""
    import transformers

    model = "smoke" if args.smoke else "qwen2.5-0.5b"
    job = make_job(args, model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(job.settings["model.path"])
    prompt_tokens = statistics.mean(len(r["prompt_ids"]) for r in job.step_rows(tokenizer))
    print(f"mean prompt length {prompt_tokens:.1f} tokens (chat template included)", flush=True)
    pythons = {"oncurve": args.oncurve_python, "TRL": args.trl_python}
    envs = {"oncurve": checkout_env(TOKENIZERS_PARALLELISM="false")}
    trl = trl_env(args.trl_python)
    if trl is not None:
        envs["TRL"] = trl
    elif not args.smoke:
        raise SystemExit(
            f"{args.trl_python} cannot import trl and {GPU_BUNDLE / 'wheels'} holds no wheels: "
            "run `make gpu-bundle` where PyPI is reachable and carry benchmarks/.gpu-bundle"
        )
    else:
        print(f"note: {args.trl_python} cannot import trl; oncurve only", flush=True)
    cap = f"-{args.gpu_memory_gb:g}gib" if args.gpu_memory_gb else ""
    key = f"{model}-{job.settings['rollout.max_new_tokens']}{cap}"
    work = WORK / "runs" / key
    shutil.rmtree(work, ignore_errors=True)
    results: dict[str, list[dict]] = {label: [] for label in envs}
    for run in range(args.runs):
        for label in envs:
            print(f"run {run + 1}/{args.runs}: {label} ...", flush=True)
            out = work / f"{label}-{run}"
            out.mkdir(parents=True)
            result = run_trainer(label, job, out, pythons[label], envs[label])
            results[label].append(result)
            if result["ok"]:
                print(f"  {statistics.median(result['seconds'][1:] or result['seconds']):.2f} "
                      f"s/step, peak GPU {result['gpu_peak_gb']} GiB (torch), "
                      f"{result['smi_peak_gb']} GiB (nvidia-smi)", flush=True)  # fmt: skip
            if args.json:  # after each run: a caller's time limit may stop the next one
                stats = {label: summarize(runs) for label, runs in results.items()}
                Path(args.json).write_text(json.dumps({"job": job.settings, "stats": stats}))
    versions = {"oncurve": interpreter_versions(pythons["oncurve"], envs["oncurve"],
                                                ("torch", "transformers"))}  # fmt: skip
    if "TRL" in envs:
        versions["TRL"] = trl_versions(pythons["TRL"], envs["TRL"])
    return key, {
        "model": model,
        "settings": job.settings | {"reward.functions": "the arith task's"},
        "gpu_memory_gb": args.gpu_memory_gb,
        "runs_per_trainer": args.runs,
        "prompt_tokens": prompt_tokens,
        "gpu": gpu_name(),
        "python_versions": versions,
        "runs": results,
    }


def summarize(runs: list[dict]) -> dict | None:
    """One trainer's figures over its finished runs (None if none finished): medians of the
    steps after each run's first, the largest peaks, mean length, and for oncurve its plan."""
    done = [r for r in runs if r["ok"]]
    if not done:
        return None

    def steady(values: list[list[float]]) -> float:
        return statistics.median([x for v in values for x in (v[1:] or v)])

    def largest(key: str) -> float | None:
        return max((r[key] for r in done if r.get(key) is not None), default=None)

    def largest_by_phase(key: str) -> dict[str, float]:
        merged: dict[str, float] = {}
        for phases in (r.get(key) or {} for r in done):
            merged |= {p: max(merged.get(p, x), x) for p, x in phases.items()}
        return merged

    return {
        "seconds": steady([r["seconds"] for r in done]),
        "phases": {p: steady([r["phases"][p] for r in done]) for p in done[0]["phases"]},
        "length": statistics.mean(x for r in done for x in r["length"]),
        **{k: largest(k) for k in ("gpu_peak_gb", "smi_peak_gb", "plan_gb", "compile_capture_s")},
        **{k: largest_by_phase(k) for k in ("phase_peaks_gb", "plan_phases_gb")},
    }


def times(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def section(row: dict) -> str:
    """The markdown section of one row: trainers and their quotient, targets, runs."""
    s, results = row["settings"], row["runs"]
    stats = {label: summarize(runs) for label, runs in results.items()}
    figures = ("seconds", *PHASES, "gpu_peak_gb", "smi_peak_gb")
    value = {label: {k: (t["phases"].get(k) if k in PHASES else t[k]) for k in figures}
             for label, t in stats.items() if t}  # fmt: skip
    table = [[label, *(cell(value[label][k], ".3f" if i < 5 else ".2f") if label in value else "n/a"
                       for i, k in enumerate(figures)),
              f"{sum(r['ok'] for r in results[label])}/{len(results[label])}"]
             for label in results]  # fmt: skip
    if len(value) == 2:
        table.append(["oncurve / TRL", *(times(value["oncurve"][k], value["TRL"][k])
                                         for k in figures), ""])  # fmt: skip
    tokens, cap = s["rollout.max_new_tokens"], row["gpu_memory_gb"]
    scope = "" if tokens == 256 and not cap else " (target set at 256 tokens)"
    targets = []
    if len(value) == 2:
        ours, base = value["oncurve"], value["TRL"]
        for name, k, limit in (("peak GPU memory", "gpu_peak_gb", 1.0),
                               ("s/step", "seconds", SPEED_TARGET)):  # fmt: skip
            q = ours[k] / base[k] if ours[k] is not None and base[k] else None
            holds = "n/a" if q is None else f"{q:.2f}x, {'yes' if q <= limit else 'no'}"
            targets.append([f"{name} <= {limit:g}x TRL's{scope}",
                            f"{cell(ours[k])} vs {cell(base[k])}", holds])  # fmt: skip
    for label, runs in results.items() if cap else ():
        finished = sum(r["ok"] for r in runs)
        targets.append([f"{label} fits in {cap:g} GiB at {tokens} tokens",
                        f"{finished}/{len(runs)} runs finished "
                        f"({', '.join(r['status'] for r in runs)})",
                        "yes" if finished == len(runs) else "no"])  # fmt: skip
    per_run = [[label, str(i + 1), r["status"], " ".join(f"{x:.2f}" for x in r.get("seconds", [])),
                cell(r.get("gpu_peak_gb")), cell(r["smi_peak_gb"]), f"{r['wall']:.0f}"]
               for i in range(row["runs_per_trainer"]) for label in results
               for r in [results[label][i]]]  # fmt: skip
    lengths = ", ".join(f"{label} {t['length']:.1f}" for label, t in stats.items() if t)
    versions = "; ".join(f"{label}'s python: {v}" for label, v in row["python_versions"].items())
    return (
        f"### {row['model']}-{tokens}{f'-{cap:g}gib' if cap else ''}: "
        f"{s['data.prompts_per_step']} prompts x G={s['rollout.group_size']}, {tokens} tokens, "
        f"{s['run.steps']} steps x {row['runs_per_trainer']} runs per trainer\n\n"
        f"Measured {row['date']} at {row['commit']} on {row['gpu']}; `{row['command']}`; "
        f"{versions}. Medians over the steps after each run's first; prompts "
        f"{row['prompt_tokens']:.1f} tokens on average, completions forced to {tokens} (mean "
        f"length {lengths}); memory cap {f'{cap:g} GiB' if cap else 'none'}. What is held "
        "equal and how each figure is measured: benchmarks/README.md, gpu_vs_trl.py.\n\n"
        + markdown_table(
            [
                "trainer",
                "s/step",
                *(f"{p} s" for p in PHASES),
                "peak GPU GiB (torch)",
                "peak GPU GiB (nvidia-smi)",
                "runs finished",
            ],
            table,
        )  # fmt: skip
        + "\n\nTargets (issues 22, 34 and 39):\n\n"
        + markdown_table(
            ["target", "measured", "holds"],
            targets or [["none measurable", "needs a run of each trainer", "n/a"]],
        )
        + "\n\nPer run (steps in order; wall includes start-up):\n\n"
        + markdown_table(
            ["trainer", "run", "status", "s per step", "torch GiB", "nvidia-smi GiB", "wall s"],
            per_run,
        )  # fmt: skip
        + "\n"
    )


def profile_variants() -> dict[str, list[str]]:
    """The settings `--profile` runs the job with, by name, the likeliest to explain the
    update's time first (the stage's limit may stop the last): the memory plan's own choices;
    decoder layers compiled (fewer kernel launches, `update_host_time.py`); nondeterministic
    kernels (what bit-exact resume costs); the reference kept on the GPU (what its offload
    costs); rows padded with each group's prompt through its KV cache (more launches,
    `update_ops.py`); four times the token budget (a quarter of the microbatches); packed
    with every row whole (fewer launches, more arithmetic)."""
    return {
        "memory plan": [],
        "memory plan, compiled layers": ["model.compile_layers=true"],
        "memory plan, nondeterministic kernels": ["run.deterministic=false"],
        "memory plan, reference kept on the GPU": ["model.offload_reference=false"],
        "memory plan, rows padded, prompts shared": ["model.pack_rows=false"],
        "memory plan, 16,384 tokens a microbatch": ["optim.microbatch_tokens=16384"],
        "memory plan, every row whole": ["model.share_prompt_forward=false"],
    }


def profile_oncurve(job: Job, out: Path) -> None:
    """`--profile`: the oncurve job in this process under each of `profile_variants`, its last
    step under `torch.profiler`; prints each step's phases (`time/*`, lines `<variant>: step
    N: {...}`) and the ops with the most GPU and CPU time in that step (profiling the whole run
    would record every compile and capture, and summing that many events takes minutes)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import oncurve.loop.trainer
    from oncurve.config import load_config
    from oncurve.errors import error_line
    from oncurve.run.metrics import read_jsonl

    steps = job.settings["run.steps"]
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    device_key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    step_of_the_run = oncurve.loop.trainer.training_step
    for variant, settings in profile_variants().items():
        run_dir = [f"run.dir={out / 'run'}", "run.overwrite=true"]
        config = load_config(None, job.oncurve_args() + run_dir + settings)
        profiles = []

        def profiled_step(s: Any, step: int, profiles: list = profiles) -> dict:
            if step < steps:
                return step_of_the_run(s, step)
            with profile(activities=activities) as prof:
                metrics = step_of_the_run(s, step)
            profiles.append(prof)
            return metrics

        oncurve.loop.trainer.training_step = profiled_step
        try:
            oncurve.loop.trainer.train(config, quiet=True)
        except Exception as error:  # noqa: BLE001 - one variant's failure: on to the next
            print(f"{variant}: failed: {error_line(error)}", flush=True)
            continue
        finally:
            oncurve.loop.trainer.training_step = step_of_the_run
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        rows = [r for r in read_jsonl(out / "run" / "metrics.jsonl") if "time/step" in r]
        for row in rows:
            times = {k.removeprefix("time/"): round(v, 3) for k, v in row.items() if "time/" in k}
            peak = row.get("memory/gpu_peak_gb")
            print(f"{variant}: step {row['step']}: {times}, peak {peak} GiB", flush=True)
        averages = profiles[0].key_averages()
        print(f"{variant}: the last step's ops", flush=True)
        print(averages.table(sort_by=device_key, row_limit=30), flush=True)
        print(averages.table(sort_by="self_cpu_time_total", row_limit=15), flush=True)
        if torch.cuda.is_available():  # far below the step's time: the GPU waits for the CPU
            busy = sum(event.self_device_time_total for event in averages) / 1e6
            print(
                f"{variant}: the last step's kernels ran {busy:.2f} s of its "
                f"{rows[-1]['time/step']:.2f} s",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--tokens", type=int, help="completion tokens (default 256; 16 --smoke)")
    add("--steps", type=int, help="steps per run (default 5; 3 over 256 tokens; 2 --smoke)")
    add("--runs", type=int, help="runs per trainer, alternating (default 2; 1 --smoke)")
    add("--gpu-memory-gb", type=float, help="GiB both trainers are capped at (run.gpu_memory_gb)")
    add("--tokenizer", help="Qwen3 tokenizer dir to copy into the cache")
    add("--oncurve-python", default=sys.executable, help="runs `-m oncurve`")
    add("--trl-python", default=sys.executable,
        help="runs the TRL child (default: this one; with the GPU bundle's wheels if it lacks trl)")  # fmt: skip
    add("--json", help="also write the summary of each trainer to this file")
    add("--prepare", action="store_true", help="copy the tokenizer, write prompts, build the model")
    add("--smoke", action="store_true", help="2-layer model on the CPU, 16 tokens (development)")
    add("--profile", action="store_true",
        help="oncurve alone, in this process, under each of the settings `profile_variants` "
        "lists: seconds per phase and the ops that take the most GPU and CPU time")  # fmt: skip
    args = parser.parse_args()
    args.runs = args.runs or (1 if args.smoke else 2)
    model = "smoke" if args.smoke else "qwen2.5-0.5b"
    if args.prepare:
        print(
            f"tokenizer {TOKENIZER}\nprompts {PROMPTS_FILE}\nmodel {prepare(model, args.tokenizer)}"
        )
        return
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_vs_trl.py: no CUDA device (use --prepare or --smoke here)", file=sys.stderr)
        raise SystemExit(2)
    if args.profile:
        profile_oncurve(make_job(args, model), WORK / "profile")
        return
    key, row = benchmark(args)
    if args.smoke:
        print(section(context() | row) + "\n(--smoke: not written to results)")
    else:
        publish("gpu_vs_trl", TITLE, key, {"renderer": "gpu_vs_trl", **row})


if __name__ == "__main__":
    main()
