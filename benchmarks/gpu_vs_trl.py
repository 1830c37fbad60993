"""oncurve against TRL's GRPOTrainer (no vLLM) on one GPU: seconds per step, each phase's
seconds and peak GPU memory, on a random-init Qwen2.5-0.5B-shaped model with the real Qwen3
tokenizer.

The job: 8 arithmetic word problems per step (the arith task's operands and answers in a ~75-token
chat prompt) x G=8 completions forced to exactly `--tokens` tokens (EOS suppressed until then),
beta 0.04, lr 1e-6 (constant), temperature 1, mu 1, bf16, the arith task's `correct` and `format`
rewards (the very same functions in both; random weights score 0). oncurve runs as `python -m
oncurve train` with its memory settings left to its defaults (on CUDA it plans microbatches and
checkpointing from free GPU memory); TRL with its own defaults where the job does not fix a
setting (gradient checkpointing on, 8 rows per microbatch, accumulated to the step's 64 rows).
The trainers alternate (oncurve, TRL, oncurve, TRL; `--runs`), each run a fresh process; seconds
per step are the median over the steps after each run's first.

The GPU machine has no ../shared and no internet: run `make gpu-bundle` here first, which puts
the Qwen3 tokenizer and TRL's wheels into benchmarks/.gpu-bundle (carry that folder). There the
tokenizer is copied into the cache, and when the interpreter cannot import trl, the bundle's
wheels are installed offline into benchmarks/.cache/gpu_vs_trl/trl-site, which the TRL child
puts first on its path; the model itself is built wherever the script runs (seconds).

    .venv/bin/python benchmarks/gpu_vs_trl.py --prepare      # here: tokenizer, prompts, model
    .venv/bin/python benchmarks/gpu_vs_trl.py --smoke        # here: 2-layer model, CPU, 16 tokens
    python3 benchmarks/gpu_vs_trl.py                         # GPU machine: 256 tokens
    python3 benchmarks/gpu_vs_trl.py --tokens 1024 --gpu-memory-gb 16
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.checkout import GPU_BUNDLE, pythonpath
from harness.children import run_child
from harness.machine import gpu_name
from harness.models import SHAPES, TOKENIZER, VOCAB, build_model, tokenizer_dir
from harness.run_logs import (
    measured_phase_peaks_gb,
    planned_peak_gb,
    planned_phase_peaks_gb,
    sampler_setup_seconds,
    step_phases,
)
from harness.spec import chat_text
from harness.tables import markdown_table, publish
from harness.trl_child import train_trl_timed, trl_reward
from harness.trl_env import trl_env, trl_phases

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CACHE = HERE / ".cache" / "gpu_vs_trl"
PROMPTS_FILE = CACHE / "prompts.jsonl"
RESULTS = HERE / "results" / "gpu_vs_trl.md"
TITLE = (
    "oncurve vs TRL's GRPOTrainer on one GPU\n\n"
    "Written by `benchmarks/gpu_vs_trl.py`, one section per completion length and memory cap."
)
GIB = 2**30

PROMPT_ROWS = 512
TRL_MICROBATCH = 8  # TrainingArguments' default per_device_train_batch_size
SPEED_TARGET = 0.35  # issue 39 (34 asked 0.5x, 22 0.85x): oncurve s/step <= 0.35x TRL's, 256 tokens
PHASES = ("generation", "reward", "reference", "train")

NAMES = ("Maria", "Tom", "Aisha", "Kenji", "Lena", "Omar", "Priya", "Diego")
STOCK = (
    ("bakery", "loaves of bread"),
    ("bookshop", "books"),
    ("farm shop", "eggs"),
    ("toy store", "marbles"),
    ("garden centre", "seed packets"),
    ("library", "magazines"),
    ("cafe", "cups"),
    ("hardware store", "screws"),
)
PROBLEM = (
    "{name} runs a {place}. On Monday morning there were {a} {item} in the storeroom, and "
    "in the afternoon a delivery brought {b} more {item}. How many {item} are in the "
    "storeroom now? Think step by step, then give the final number as <answer>N</answer>."
)


@dataclass
class Job:
    """One GRPO job, the settings both trainers are given."""

    model_dir: str
    prompts_file: str
    prompts: int
    group: int
    tokens: int  # every completion exactly this long (min = max new tokens)
    steps: int
    lr: float
    beta: float
    seed: int
    device: str  # cuda, or cpu for --smoke
    gpu_memory_gb: float | None  # GiB both trainers are capped at; None: the whole card


# --- shared by both sides ----------------------------------------------------------------------


def word_problems(n: int) -> list[dict[str, str]]:
    """`n` addition word problems {"prompt", "answer"} on the arith task's train rows (their
    operands and answers), so that the task's `correct` reward scores them."""
    from oncurve.data.tasks import get_task

    problems = []
    for i, row in enumerate(get_task("arith").examples("train", n, seed=0)):
        a, b = (int(x) for x in row["prompt"].rstrip("=").split("+"))
        place, item = STOCK[i % len(STOCK)]
        name = NAMES[i // len(STOCK) % len(NAMES)]
        prompt = PROBLEM.format(name=name, place=place, item=item, a=a, b=b)
        problems.append({"prompt": prompt, "answer": row["answer"]})
    return problems


def step_rows(job: Job, tokenizer: Any) -> list[dict]:
    """The rows oncurve's trainer draws for steps 1..steps, in order, each with its chat-template
    "prompt_ids" (its loading of `data.path` and its seeded order, as `oncurve train` does)."""
    from oncurve.config import load_config
    from oncurve.data.prompts import PromptData, load_prompts

    overrides = [f"data.path={job.prompts_file}", "data.chat_template=true", f"run.seed={job.seed}"]
    config = load_config(None, overrides)
    rows, _, _ = load_prompts(config)
    ordered = PromptData(rows, tokenizer, config.data, seed=config.run.seed)
    return [row for step in range(1, job.steps + 1) for row in ordered.batch(step, job.prompts)]


def reward_specs() -> list[tuple[str, Any, float]]:
    """(name, function, weight) of the arith task's rewards, which both trainers use."""
    from oncurve.data.tasks import get_task

    task = get_task("arith")
    return [(name, fn, task.reward_weights[name]) for name, fn in task.reward_fns().items()]


# --- the TRL child (runs in TRL's environment) -------------------------------------------------


def trl_child(job: Job, out_dir: Path) -> None:
    """Train with TRL's GRPOTrainer; write per-step times, phases and peak memory to
    `out_dir/result.json`."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    cuda = job.device == "cuda"
    sync = torch.cuda.synchronize if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        if job.gpu_memory_gb:
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, job.gpu_memory_gb * GIB / total))
    tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
    rows = step_rows(job, tokenizer)
    texts = [chat_text(tokenizer, row["prompt"]) for row in rows]
    for text, row in zip(texts, rows, strict=True):
        if tokenizer(text=text)["input_ids"] != row["prompt_ids"]:
            raise SystemExit(f"TRL would tokenize {text!r} to other ids than oncurve")
    dataset = Dataset.from_list(
        [{"prompt": text, "answer": row["answer"]} for text, row in zip(texts, rows, strict=True)]
    )
    rewards = reward_specs()
    rows_per_step = job.prompts * job.group
    args = GRPOConfig(
        output_dir=str(out_dir / "trainer"),
        use_cpu=not cuda,
        bf16=cuda,
        model_init_kwargs={"dtype": torch.bfloat16 if cuda else torch.float32},
        gradient_checkpointing=True,
        per_device_train_batch_size=TRL_MICROBATCH,
        gradient_accumulation_steps=rows_per_step // TRL_MICROBATCH,
        num_generations=job.group,
        max_completion_length=job.tokens,
        generation_kwargs={"min_new_tokens": job.tokens},
        use_vllm=False,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=job.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,  # oncurve's AdamW betas and grad clip
        adam_beta2=0.99,
        max_grad_norm=1.0,
        beta=job.beta,
        num_iterations=1,
        loss_type="grpo",
        scale_rewards="group",
        mask_truncated_completions=False,  # every completion is cut at max length
        reward_weights=[weight for _, _, weight in rewards],
        shuffle_dataset=False,
        max_steps=job.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=job.seed,
        dataloader_num_workers=0,
    )
    seen: list[list[str]] = []  # the prompts each reward call scored, checked by the parent
    funcs = [trl_reward(name, fn, job.group, seen) for name, fn, _ in rewards]
    trainer, phases, seconds = train_trl_timed(args, job.model_dir, funcs, dataset, tokenizer, sync)
    if len(seconds) != job.steps or len(phases["prepare"]) != job.steps:
        raise SystemExit(
            f"expected {job.steps} steps of one generation each, timed {len(seconds)} "
            f"steps and {len(phases['prepare'])} generations"
        )
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    result = {
        "seconds": seconds,
        **phases,
        "length": [entry["completions/mean_length"] for entry in logs],
        "prompts": seen[:: len(rewards)],
        "gpu_peak_gb": torch.cuda.max_memory_allocated() / GIB if cuda else None,
    }
    (out_dir / "result.json").write_text(json.dumps(result))


# --- the parent --------------------------------------------------------------------------------


def prepare(model: str, tokenizer_source: str | None) -> tuple[Path, Path]:
    """Tokenizer in the cache, the prompts file (rewritten: it is deterministic) and the model;
    returns (model dir, prompts file)."""
    import transformers

    tokenizer_path = tokenizer_dir(tokenizer_source)
    CACHE.mkdir(parents=True, exist_ok=True)
    problems = word_problems(PROMPT_ROWS)
    PROMPTS_FILE.write_text("".join(json.dumps(row) + "\n" for row in problems))
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path)
    lengths = [
        len(tokenizer(text=chat_text(tokenizer, row["prompt"]))["input_ids"]) for row in problems
    ]
    print(
        f"{len(problems)} prompts in {PROMPTS_FILE}, {statistics.mean(lengths):.1f} tokens on "
        f"average with the chat template ({min(lengths)}-{max(lengths)})",
        flush=True,
    )
    return build_model(model, tokenizer_path), PROMPTS_FILE


def versions(python: str, env: dict[str, str], trl: bool = False) -> str:
    """The library versions `python` imports in `env` (trl's, accelerate's and datasets' too
    if `trl`)."""
    names = ["torch", "transformers"] + (["trl", "accelerate", "datasets"] if trl else [])
    code = f"import {', '.join(names)}; print(', '.join(m.__name__ + ' ' + m.__version__ for m in "
    code += f"[{', '.join(names)}]))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    return out.stdout.strip() if out.returncode == 0 else f"({python}: {out.stderr.strip()[-200:]})"


class NvidiaSmiPeak:
    """Peak `memory.used` of GPU 0 in GiB as nvidia-smi reports it, sampled every `interval`
    seconds while the `with` block runs: the CUDA context and the allocator's cached blocks
    included, which `torch.cuda.max_memory_allocated` leaves out. None without nvidia-smi."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.peak_gb: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i"]
        while not self._done.is_set():
            out = subprocess.run([*query, "0"], capture_output=True, text=True)
            if out.returncode == 0:
                used = float(out.stdout.strip()) / 1024  # MiB
                self.peak_gb = max(self.peak_gb or 0.0, used)
            self._done.wait(self.interval)

    def __enter__(self) -> NvidiaSmiPeak:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()


def run_trainer(label: str, job: Job, out: Path, python: str, env: dict[str, str]) -> dict:
    """One run of `label` (oncurve or TRL) in a fresh process with `env`: its per-step seconds
    and phases, peak GPU memory (torch's counter and nvidia-smi's; for oncurve also its memory
    plan's prediction), wall time and whether it finished."""
    env = {**env, "TOKENIZERS_PARALLELISM": "false"}
    if label == "oncurve":
        command = [python, "-m", "oncurve", "train", "--quiet", *oncurve_overrides(job, out)]
    else:
        (out / "job.json").write_text(json.dumps(asdict(job)))
        env = {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
        command = [python, str(Path(__file__).resolve()), "--trl-child", str(out)]
    log = out / "log.txt"
    with NvidiaSmiPeak() as smi:
        wall, _, code = run_child(command, env, log, check=False)
    result: dict[str, Any] = {"wall": wall, "smi_peak_gb": smi.peak_gb, "ok": code == 0}
    if code:
        text = log.read_text()
        result["status"] = "OOM" if "out of memory" in text.lower() else f"failed ({code})"
        print(f"  {label} {result['status']}; log: {log}\n{text[-1500:]}", flush=True)
        return result
    result["status"] = "finished"
    result.update(read_oncurve(out / "run") if label == "oncurve" else read_trl(job, out))
    result["plan_gb"] = planned_peak_gb(log.read_text()) if label == "oncurve" else None
    if label == "oncurve":
        result["plan_phases_gb"] = planned_phase_peaks_gb(log.read_text())
    return result


def oncurve_overrides(job: Job, out: Path) -> list[str]:
    """`oncurve train` overrides for `job`, memory settings left to oncurve's defaults."""
    rewards = [
        {"name": f"{fn.__module__}:{fn.__qualname__}", "weight": w} for _, fn, w in reward_specs()
    ]
    overrides: dict[str, Any] = {
        "run.device": job.device,
        "model.path": job.model_dir,
        "data.path": job.prompts_file,
        "data.chat_template": "true",
        "reward.functions": json.dumps(rewards),
        "data.prompts_per_step": job.prompts,
        "rollout.group_size": job.group,
        "rollout.max_new_tokens": job.tokens,
        "rollout.min_new_tokens": job.tokens,
        "rollout.temperature": 1.0,
        "algo.preset": "grpo",
        "algo.beta": job.beta,
        "algo.mu": 1,
        "optim.lr": job.lr,
        "optim.warmup_steps": 0,
        "eval.at_start_end": "false",
        "log.samples_per_step": 0,
        "run.steps": job.steps,
        "run.seed": job.seed,
        "run.dir": str(out / "run"),
        "run.overwrite": "true",
    }
    if job.gpu_memory_gb:
        overrides["run.gpu_memory_gb"] = job.gpu_memory_gb
    return [f"{key}={value}" for key, value in overrides.items()]


def read_oncurve(run_dir: Path) -> dict:
    """Seconds, phases and peak GPU memory of a finished oncurve run from its metrics.jsonl (the
    `memory/gpu_peak_gb` of every step; None where the metric is absent, as on CPU); its
    weights and checkpoints are deleted (GBs per run)."""
    from oncurve.run.metrics import read_jsonl

    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "time/step" in r]
    phases = step_phases(rows)
    peaks = [r["memory/gpu_peak_gb"] for r in rows if r.get("memory/gpu_peak_gb") is not None]
    for folder in ("checkpoints", "final"):
        shutil.rmtree(run_dir / folder, ignore_errors=True)
    return {
        "seconds": [r["time/step"] for r in rows],
        "phases": {
            "generation": phases["rollout"],
            **{k: phases[k] for k in PHASES[1:] if k in phases},
        },
        "gpu_peak_gb": max(peaks) if peaks else None,
        "phase_peaks_gb": measured_phase_peaks_gb(rows),
        "length": [r["length/mean"] for r in rows],
        "compile_capture_s": sampler_setup_seconds(rows[-1]) if rows else None,
    }


def read_trl(job: Job, out: Path) -> dict:
    """Seconds, phases and peak GPU memory of a finished TRL run from its result.json, after
    checking that its reward calls saw oncurve's prompts of every step, in order."""
    from transformers import AutoTokenizer

    result = json.loads((out / "result.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
    texts = [chat_text(tokenizer, row["prompt"]) for row in step_rows(job, tokenizer)]
    expected = [texts[i : i + job.prompts] for i in range(0, len(texts), job.prompts)]
    if result["prompts"] != expected:
        raise SystemExit(f"TRL trained on other prompts than oncurve; see {out / 'result.json'}")
    return {
        "seconds": result["seconds"],
        "phases": trl_phases(result, "generation"),
        "gpu_peak_gb": result["gpu_peak_gb"],
        "length": result["length"],
    }


def summarize(runs: list[dict]) -> dict | None:
    """Medians over the finished runs' steps after each one's first, and the peaks; None if no
    run finished."""
    done = [r for r in runs if r["ok"]]
    if not done:
        return None

    def steady(values: list[list[float]]) -> float:
        return statistics.median([x for v in values for x in (v[1:] or v)])

    gpu = [r["gpu_peak_gb"] for r in done if r["gpu_peak_gb"] is not None]
    smi = [r["smi_peak_gb"] for r in done if r["smi_peak_gb"] is not None]
    plans = [r["plan_gb"] for r in done if r["plan_gb"] is not None]
    return {
        "seconds": steady([r["seconds"] for r in done]),
        "phases": {
            phase: steady([r["phases"][phase] for r in done])
            for phase in PHASES
            if phase in done[0]["phases"]
        },
        "gpu_peak_gb": max(gpu) if gpu else None,
        "smi_peak_gb": max(smi) if smi else None,
        "plan_gb": max(plans) if plans else None,
        # oncurve's phases (TRL's runs log none): each one's largest over the runs
        "phase_peaks_gb": largest([r.get("phase_peaks_gb", {}) for r in done]),
        "plan_phases_gb": largest([r.get("plan_phases_gb", {}) for r in done]),
        "length": statistics.mean(x for r in done for x in r["length"]),
        "compile_capture_s": max(
            (r["compile_capture_s"] for r in done if r.get("compile_capture_s") is not None),
            default=None,
        ),
    }


def largest(values: list[dict[str, float]]) -> dict[str, float]:
    """Each key's largest value over `values`."""
    merged: dict[str, float] = {}
    for value in values:
        for key, x in value.items():
            merged[key] = max(merged.get(key, x), x)
    return merged


def number(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def make_job(args: argparse.Namespace) -> tuple[Job, str]:
    """The job both trainers run, its model prepared; returns (job, model name)."""
    model = "smoke" if args.smoke else "qwen2.5-0.5b"
    model_path, prompts_file = prepare(model, args.tokenizer)
    tokens = args.tokens or (16 if args.smoke else 256)
    job = Job(
        model_dir=str(model_path),
        prompts_file=str(prompts_file),
        prompts=8,
        group=8,
        tokens=tokens,
        steps=args.steps or (2 if args.smoke else 5 if tokens <= 256 else 3),
        lr=1e-6,
        beta=0.04,
        seed=0,
        device="cpu" if args.smoke else "cuda",
        gpu_memory_gb=args.gpu_memory_gb,
    )
    return job, model


def profile_variants() -> dict[str, list[str]]:
    """The settings `--profile` runs the job with, by name, the likeliest to explain the
    update's time first (the stage's limit may stop the last): the memory plan's own choices
    (rows packed, each group's prompt once, where torch has variable-length attention, and the
    reference's weights offloaded to host memory between its passes); with the decoder layers
    compiled (`model.compile_layers`: fewer kernels, and 0.57x the host's time per update on
    the CPU, `update_host_time.py`, if the host's time is what the GPU waits for); without
    deterministic kernels (what bit-exact resume costs, the logprob backward's sorted
    `index_put_` among it: TRL does not ask for them); with the reference kept on the GPU
    (`model.offload_reference=false`: what the offload's copy costs); with the rows padded and
    each group's prompt run once through its KV cache (`model.pack_rows=false`, the default
    before packing: about twice TRL's kernel launches in the update and the reference pass,
    `update_ops.py`); with four times the token budget (a quarter of the microbatches, so of
    the launches, for more activation memory); and packed with every row whole (fewer
    launches than each prompt once, more arithmetic)."""
    return {
        "memory plan": [],
        "memory plan, compiled layers": ["model.compile_layers=true"],
        "memory plan, nondeterministic kernels": ["run.deterministic=false"],
        "memory plan, reference kept on the GPU": ["model.offload_reference=false"],
        "memory plan, rows padded, prompts shared": ["model.pack_rows=false"],
        "memory plan, 16,384 tokens a microbatch": ["optim.microbatch_tokens=16384"],
        "memory plan, every row whole": ["model.share_prompt_forward=false"],
    }


def profile_oncurve(args: argparse.Namespace) -> None:
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

    job, _ = make_job(args)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    device_key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    step_of_the_run = oncurve.loop.trainer.training_step
    for variant, settings in profile_variants().items():
        out = CACHE / "profile"
        config = load_config(None, oncurve_overrides(job, out) + settings)
        profiles = []

        def profiled_step(s: Any, step: int, profiles: list = profiles) -> dict:
            if step < job.steps:
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


def benchmark(args: argparse.Namespace) -> tuple[str, str]:
    """Run the trainers alternately; returns (section key, markdown section)."""
    import transformers

    job, model = make_job(args)
    tokenizer = transformers.AutoTokenizer.from_pretrained(job.model_dir)
    prompt_tokens = statistics.mean(len(r["prompt_ids"]) for r in step_rows(job, tokenizer))
    print(f"mean prompt length {prompt_tokens:.1f} tokens (chat template included)", flush=True)
    pythons = {"oncurve": args.oncurve_python, "TRL": args.trl_python}
    src = [str(ROOT / "src"), *pythonpath()]
    envs = {"oncurve": {**os.environ, "PYTHONPATH": os.pathsep.join(src)}}
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
    labels = list(envs)
    work = CACHE / "runs" / key_of(job, model)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    results: dict[str, list[dict]] = {label: [] for label in labels}
    for run in range(args.runs):
        for label in labels:
            out = work / f"{label}-{run}"
            out.mkdir()
            print(f"run {run + 1}/{args.runs}: {label} ...", flush=True)
            result = run_trainer(label, job, out, pythons[label], envs[label])
            if result["ok"]:
                seconds = statistics.median(result["seconds"][1:] or result["seconds"])
                print(
                    f"  {seconds:.2f} s/step, peak GPU {number(result['gpu_peak_gb'])} GiB "
                    f"(torch), {number(result['smi_peak_gb'])} GiB (nvidia-smi), wall "
                    f"{result['wall']:.0f} s",
                    flush=True,
                )
            results[label].append(result)
            if args.json:  # after each run: a caller's time limit may stop the next one
                stats = {label: summarize(runs) for label, runs in results.items()}
                Path(args.json).write_text(json.dumps({"job": asdict(job), "stats": stats}))
    header = {label: versions(pythons[label], envs[label], trl=label == "TRL") for label in labels}
    return key_of(job, model), report(job, model, prompt_tokens, results, header, args)


def key_of(job: Job, model: str) -> str:
    """The results section of a job: model, completion length and memory cap."""
    cap = f"-{job.gpu_memory_gb:g}gib" if job.gpu_memory_gb else ""
    return f"{model}-{job.tokens}{cap}"


def targets(job: Job, stats: dict[str, dict | None], results: dict[str, list[dict]]) -> list:
    """Rows of the issue's targets: at 256 tokens oncurve's peak memory <= TRL's and s/step <=
    SPEED_TARGET x TRL's; under a memory cap (1024 tokens, 16 GiB in the issue) oncurve finishes."""
    rows = []
    ours, base = stats["oncurve"], stats.get("TRL")
    scope = "" if job.tokens == 256 and not job.gpu_memory_gb else " (target set at 256 tokens)"
    if ours and base:
        memory = ratio(ours["gpu_peak_gb"], base["gpu_peak_gb"])
        speed = ratio(ours["seconds"], base["seconds"])
        rows.append(
            [
                f"peak GPU memory <= TRL's{scope}",
                f"{number(ours['gpu_peak_gb'])} vs {number(base['gpu_peak_gb'])} GiB",
                "n/a" if memory is None else f"{memory:.2f}x, {'yes' if memory <= 1 else 'no'}",
            ]
        )
        rows.append(
            [
                f"s/step <= {SPEED_TARGET}x TRL's{scope}",
                f"{ours['seconds']:.2f} vs {base['seconds']:.2f} s",
                f"{speed:.2f}x, {'yes' if speed <= SPEED_TARGET else 'no'}",
            ]
        )
    if job.gpu_memory_gb:
        for label, runs in results.items():
            finished = sum(r["ok"] for r in runs)
            statuses = ", ".join(r["status"] for r in runs)
            target = " (target at 1024 tokens)" if label == "oncurve" else " (reported)"
            rows.append(
                [
                    f"{label} fits in {job.gpu_memory_gb:g} GiB at {job.tokens} tokens{target}",
                    f"{finished}/{len(runs)} runs finished ({statuses})",
                    "yes" if finished == len(runs) else "no",
                ]
            )
    return rows or [["none measurable", "needs a finished run of each trainer", "n/a"]]


def report(
    job: Job,
    model: str,
    prompt_tokens: float,
    results: dict[str, list[dict]],
    header: dict[str, str],
    args: argparse.Namespace,
) -> str:
    """The markdown section: summary table with ratios, targets, per-run rows, what differs."""
    stats = {label: summarize(runs) for label, runs in results.items()}
    columns = ["trainer", "s/step", *(f"{p} s" for p in PHASES)]
    columns += ["peak GPU GiB (torch)", "peak GPU GiB (nvidia-smi)", "runs finished"]
    rows = []
    for label, s in stats.items():
        finished = f"{sum(r['ok'] for r in results[label])}/{len(results[label])}"
        if s is None:
            rows.append([label, *["n/a"] * (len(columns) - 2), finished])
            continue
        phases = [number(s["phases"].get(p), 3) for p in PHASES]
        rows.append(
            [
                label,
                number(s["seconds"], 3),
                *phases,
                number(s["gpu_peak_gb"]),
                number(s["smi_peak_gb"]),
                finished,
            ]
        )
    ours, base = stats["oncurve"], stats.get("TRL")
    if ours and base:
        quotients = [ratio(ours["phases"].get(p), base["phases"].get(p)) for p in PHASES]
        rows.append(
            [
                "oncurve / TRL",
                f"{ratio(ours['seconds'], base['seconds']):.2f}x",
                *("n/a" if q is None else f"{q:.2f}x" for q in quotients),
                *(
                    "n/a" if q is None else f"{q:.2f}x"
                    for q in (
                        ratio(ours["gpu_peak_gb"], base["gpu_peak_gb"]),
                        ratio(ours["smi_peak_gb"], base["smi_peak_gb"]),
                    )
                ),
                "",
            ]
        )
    per_run = [
        [
            label,
            str(i + 1),
            r["status"],
            " ".join(f"{s:.2f}" for s in r.get("seconds", [])),
            number(r.get("gpu_peak_gb")),
            number(r["smi_peak_gb"]),
            f"{r['wall']:.0f}",
        ]
        for i in range(args.runs)
        for label in results
        for r in [results[label][i]]
    ]
    cap = f"{job.gpu_memory_gb:g} GiB" if job.gpu_memory_gb else "none (the whole card)"
    precision = "bf16=True, bf16 weights" if job.device == "cuda" else "fp32 on the CPU"
    lengths = ", ".join(f"{label} {s['length']:.1f}" for label, s in stats.items() if s)
    command = f"python benchmarks/gpu_vs_trl.py --tokens {job.tokens} --steps {job.steps} "
    command += f"--runs {args.runs}" + (
        f" --gpu-memory-gb {job.gpu_memory_gb:g}" if job.gpu_memory_gb else ""
    )
    notes = [
        f"model: random {model} (Qwen2, {SHAPES[model][2]} layers, hidden {SHAPES[model][0]}, "
        f"vocab {VOCAB}, tied embeddings, bf16 weights) with the Qwen3 tokenizer",
        f"prompts: {job.prompts} per step x G={job.group}, {prompt_tokens:.1f} tokens on average "
        "(chat template included); the same rows in the same order in both (TRL's dataset is "
        "oncurve's per-step order, shuffle off, given as the chat-template text, which TRL "
        "tokenizes to the same ids; the script checks both)",
        f"completions forced to exactly {job.tokens} tokens (oncurve rollout.min_new_tokens, TRL "
        f"generation_kwargs min_new_tokens); mean length {lengths}",
        "oncurve: its defaults for dtype (model.dtype auto: bf16 on CUDA, fp32 on the CPU) and "
        "memory (microbatch rows, gradient checkpointing and logits chunk planned from free GPU "
        f"memory); memory cap {cap} (run.gpu_memory_gb)",
        f"TRL: gradient checkpointing on (its default), {TRL_MICROBATCH} rows per "
        f"forward/backward (TrainingArguments' default per_device_train_batch_size) x "
        f"{job.prompts * job.group // TRL_MICROBATCH} accumulation steps = one generation batch "
        f"of the step's rows, {precision}, use_vllm=False (model.generate), loss_type=grpo, "
        "scale_rewards=group, mask_truncated_completions=False; memory cap "
        f"{cap} (torch.cuda.set_per_process_memory_fraction)",
        "same in both: lr (constant, no warmup), AdamW betas (0.9, 0.99), grad clip 1.0, beta "
        f"{job.beta} (k3 KL in the loss), epsilon 0.2, mu 1, temperature 1, no top-k/top-p, "
        "the arith task's rewards (`correct` + 0.1 x `format`, the same functions)",
        "not matched: each trainer's sampling RNG; TRL's group std is unbiased (N-1), oncurve's "
        "the population std",
        "s/step: oncurve's time/step from metrics.jsonl (rollout + reward + reference + train); "
        "TRL's on_step_begin to on_step_end with torch.cuda.synchronize at both ends; phases: "
        "oncurve's time/<phase>, TRL's timed methods (generation: _generate_single_turn, "
        "reference: the rest of _generate_and_score_completions, train: the rest of the step)",
        "peak GPU (torch): oncurve's memory/gpu_peak_gb (max over steps), TRL's "
        "torch.cuda.max_memory_allocated at the end; peak GPU (nvidia-smi): the device's "
        "memory.used sampled every 0.5 s during the run (CUDA context and allocator cache "
        "included)",
    ]
    return (
        f"### {key_of(job, model)}: {job.prompts} prompts x G={job.group}, {job.tokens} tokens, "
        f"{job.steps} steps x {args.runs} runs per trainer\n\n"
        f"Measured {time.strftime('%Y-%m-%d')} on {gpu_name()}; `{command}`; oncurve's python: "
        f"{header['oncurve']}; TRL's: {header.get('TRL', 'not run')}. Medians over the steps "
        "after each run's first.\n\n"
        + markdown_table(columns, rows)
        + "\n\nTargets (issues 22 and 34):\n\n"
        + markdown_table(["target", "measured", "holds"], targets(job, stats, results))
        + "\n\nPer run (steps in order; wall includes start-up):\n\n"
        + markdown_table(
            ["trainer", "run", "status", "s per step", "torch GiB", "nvidia-smi GiB", "wall s"],
            per_run,
        )
        + "\n\nSettings:\n\n"
        + "\n".join(f"- {note}" for note in notes)
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, help="completion tokens (default 256; 16 --smoke)")
    parser.add_argument(
        "--steps", type=int, help="steps per run (default 5; 3 over 256 tokens; 2 --smoke)"
    )
    parser.add_argument(
        "--runs", type=int, help="runs per trainer, alternating (default 2; 1 --smoke)"
    )
    parser.add_argument(
        "--gpu-memory-gb", type=float, help="GiB both trainers are capped at (run.gpu_memory_gb)"
    )
    parser.add_argument("--tokenizer", help="Qwen3 tokenizer dir to copy into the cache")
    parser.add_argument("--oncurve-python", default=sys.executable, help="runs `-m oncurve`")
    parser.add_argument(
        "--trl-python",
        default=sys.executable,
        help="runs the TRL child (default: this one; with the GPU bundle's wheels if it lacks trl)",
    )
    parser.add_argument("--json", help="also write the summary of each trainer to this file")
    parser.add_argument(
        "--prepare", action="store_true", help="copy the tokenizer, write prompts, build the model"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="2-layer model on the CPU, 16 tokens (development)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="oncurve alone, in this process, under each of the settings `profile_variants` "
        "lists: seconds per phase and the ops that take the most GPU and CPU time",
    )
    parser.add_argument("--trl-child", help=argparse.SUPPRESS)  # run TRL, write into this dir
    args = parser.parse_args()
    args.runs = args.runs or (1 if args.smoke else 2)
    if args.trl_child:
        out = Path(args.trl_child)
        trl_child(Job(**json.loads((out / "job.json").read_text())), out)
        return
    if args.prepare:
        model_path, prompts_file = prepare(
            "smoke" if args.smoke else "qwen2.5-0.5b", args.tokenizer
        )
        print(f"tokenizer {TOKENIZER}\nprompts {prompts_file}\nmodel {model_path}")
        return
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_vs_trl.py: no CUDA device (use --prepare or --smoke here)", file=sys.stderr)
        raise SystemExit(2)
    if args.profile:
        profile_oncurve(args)
        return
    key, section = benchmark(args)
    print("\n" + section, flush=True)
    if args.smoke:
        print("(--smoke: not written to results)")
    else:
        publish(RESULTS.stem, TITLE, key, {"markdown": section})


if __name__ == "__main__":
    main()
