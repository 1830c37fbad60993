"""oncurve against TRL's GRPOTrainer on the same GRPO job: seconds per step, peak memory, reward
and held-out accuracy after the same steps, and how far each is above the step's FLOP floor.

Both trainers get the same model directory, prompts (the same rows in the same order: TRL's
dataset is oncurve's per-step order with shuffling off), rewards (the arith task's own `correct`
and `format` functions with its weights), G, prompts per step, completion length, learning rate,
AdamW betas, grad clip, beta, epsilon, mu and steps. They run alternately (oncurve, TRL,
oncurve, TRL, ...), each in a fresh subprocess whose peak RSS is read with `os.wait4`. Seconds per
step are the median over all runs' steps except each run's first (warm-up); each final model is
then scored by the same `oncurve eval` command on exported held-out prompts.

TRL lives in its own virtual environment (`benchmarks/.venv-trl`, created on first use: the CPU
torch wheel first, then whatever `pip install trl` resolves); it is never a dependency of oncurve.
The TRL child imports oncurve (PYTHONPATH=src) only for the task's rows and reward functions.

    .venv/bin/python benchmarks/vs_trl.py                          # the bundled default model
    .venv/bin/python benchmarks/vs_trl.py --model 30m --steps 4    # ~30M params, 8 x 8, 128 tokens
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from common import (  # noqa: E402
    load_model,
    load_note,
    markdown_table,
    matmul_gflops,
    run_child,
    step_phases,
    train_trl_timed,
    trl_phases,
    trl_reward,
    write_section,
)

TRL_VENV = HERE / ".venv-trl"
CACHE = HERE / ".cache" / "vs_trl"
RESULTS = HERE / "results" / "vs_trl.md"
TITLE = "oncurve vs TRL's GRPOTrainer\n\nWritten by `benchmarks/vs_trl.py`, one section per model."
TORCH_PIN = "torch==2.13.0"  # the CPU wheel on disk; a loose torch pulls a multi-GB CUDA build


@dataclass
class Job:
    """One GRPO job, the settings both trainers are given."""

    model_dir: str
    prompts: int
    group: int
    tokens: int
    force_length: bool  # suppress EOS until `tokens` (random weights: every completion full)
    lr: float
    beta: float
    epsilon: float
    mu: int
    steps: int
    seed: int
    microbatch: int
    gradient_checkpointing: bool
    adam_beta1: float
    adam_beta2: float
    grad_clip: float


# model -> (prompts per step, G, completion tokens, force full length, default steps, rows per
# forward/backward). At 30M, 64 rows of 144 tokens put every MLP activation over glibc's 32 MB
# mmap threshold, and page faults took about a quarter of the update (TRL's train phase 15.4 s
# at 64 rows against 11.5-11.8 s at 16, 2026-11-24): 16 rows is the faster setting for both.
SCENARIOS = {
    "default": (16, 8, 64, False, 20, 64),
    "tiny": (16, 8, 64, False, 8, 64),
    "30m": (8, 8, 128, True, 4, 16),
}
TARGETS = {"default": 0.6, "tiny": 0.6, "30m": 0.8}  # oncurve s/step <= target x TRL's


# --- shared by both sides ----------------------------------------------------------------------


def step_rows(job: Job, tokenizer) -> list[dict]:
    """The prompt rows oncurve's trainer draws for steps 1..steps with `job.seed`, in order
    (the arith task's train split and `PromptData`'s seeded order, as `oncurve train` does)."""
    from oncurve.config import DataConfig
    from oncurve.data.prompts import PromptData
    from oncurve.data.tasks import get_task

    data = DataConfig()
    rows = get_task("arith").examples("train", data.num_train, job.seed)
    ordered = PromptData(rows, tokenizer, data, seed=job.seed)
    return [row for step in range(1, job.steps + 1) for row in ordered.batch(step, job.prompts)]


# --- the TRL child (runs in .venv-trl) ---------------------------------------------------------


def trl_child(job: Job, out_dir: Path) -> None:
    """Train with TRL's GRPOTrainer; write per-step times, phases and logs to `out_dir`."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from oncurve.data.tasks import get_task

    tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
    rows = step_rows(job, tokenizer)
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    task = get_task("arith")
    fns = task.reward_fns()
    rows_per_step = job.prompts * job.group
    per_device = min(job.microbatch, rows_per_step)
    if rows_per_step % per_device:
        raise SystemExit(f"prompts x G = {rows_per_step} must be a multiple of {per_device}")
    args = GRPOConfig(
        output_dir=str(out_dir / "trainer"),
        use_cpu=True,
        bf16=False,
        model_init_kwargs={"dtype": torch.float32},
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=rows_per_step // per_device,
        num_generations=job.group,
        max_completion_length=job.tokens,
        generation_kwargs={"min_new_tokens": job.tokens} if job.force_length else None,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=job.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=job.adam_beta1,
        adam_beta2=job.adam_beta2,
        max_grad_norm=job.grad_clip,
        beta=job.beta,
        epsilon=job.epsilon,
        num_iterations=job.mu,
        loss_type="grpo",
        scale_rewards="group",
        mask_truncated_completions=False,
        reward_weights=[task.reward_weights[name] for name in fns],
        gradient_checkpointing=job.gradient_checkpointing,
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
    funcs = [trl_reward(name, fn, job.group, seen) for name, fn in fns.items()]
    trainer, phases, steps = train_trl_timed(args, job.model_dir, funcs, dataset, tokenizer)
    trainer.save_model(str(out_dir / "final"))
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    result = {
        "seconds": steps.seconds,
        "generate": phases["generate"],
        "reward_seconds": phases["reward"],
        "prepare": phases["prepare"],
        "reward": [entry["reward"] for entry in logs],
        "length": [entry["completions/mean_length"] for entry in logs],
        "prompts": seen[:: len(fns)],
    }
    (out_dir / "result.json").write_text(json.dumps(result))


# --- the parent (runs in oncurve's .venv) ------------------------------------------------------


def transformers_version() -> str:
    """The transformers oncurve runs on (this interpreter's; TRL's venv has its own)."""
    import transformers

    return transformers.__version__


def ensure_trl_venv() -> str:
    """The TRL venv's python, creating the venv on first use; returns the versions line."""
    python = TRL_VENV / "bin" / "python"
    probe = [str(python), "-c", "import trl"]
    if not python.exists() or subprocess.run(probe, capture_output=True).returncode:
        print(f"creating {TRL_VENV} (torch CPU wheel, then trl) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, TORCH_PIN], check=True)
        subprocess.run([*pip, "trl"], check=True)
    versions = (
        "import trl, transformers, torch, accelerate; print(f'trl {trl.__version__}, "
        "transformers {transformers.__version__}, torch {torch.__version__}, "
        "accelerate {accelerate.__version__}')"
    )
    out = subprocess.run([str(python), "-c", versions], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def model_dir(name: str) -> Path:
    """A model directory both trainers load: the bundled default, a path, or a `common` model
    saved once under benchmarks/.cache."""
    from oncurve.model.sources import resolve_model_path

    if name not in ("tiny", "30m"):
        path = resolve_model_path(name)
        if not (path / "config.json").is_file():
            raise SystemExit(f"model {name}: {path} holds no model yet; use --model tiny")
        return path
    path = CACHE / "models" / name
    if not (path / "config.json").is_file():
        model, tokenizer = load_model(name)
        model.save_pretrained(path, safe_serialization=True)
        tokenizer.save_pretrained(path)
    return path


def run_oncurve(job: Job, out: Path) -> dict:
    overrides = {
        "model.path": job.model_dir,
        "model.gradient_checkpointing": job.gradient_checkpointing,
        "data.task": "arith",
        "data.prompts_per_step": job.prompts,
        "rollout.group_size": job.group,
        "rollout.max_new_tokens": job.tokens,
        "rollout.min_new_tokens": job.tokens if job.force_length else 0,
        "rollout.temperature": 1.0,
        "algo.preset": "grpo",
        "algo.beta": job.beta,
        "algo.epsilon": job.epsilon,
        "algo.mu": job.mu,
        "optim.lr": job.lr,
        "optim.beta1": job.adam_beta1,
        "optim.beta2": job.adam_beta2,
        "optim.grad_clip": job.grad_clip,
        "optim.schedule": "constant",
        "optim.microbatch_size": job.microbatch,
        "eval.at_start_end": False,
        "log.samples_per_step": 0,
        "run.steps": job.steps,
        "run.seed": job.seed,
        "run.dir": str(out / "run"),
        "run.overwrite": True,
        "run.device": "cpu",  # a CPU benchmark, also on a machine with a GPU
    }
    command = [sys.executable, "-m", "oncurve", "train", "--quiet"]
    command += [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()]
    wall, rss, _ = run_child(command, dict(os.environ), out / "log.txt")
    from oncurve.run.metrics import read_jsonl

    rows = [r for r in read_jsonl(out / "run" / "metrics.jsonl") if "time/step" in r]
    return {
        "wall": wall,
        "rss": rss,
        "final": str(out / "run" / "final"),
        "seconds": [r["time/step"] for r in rows],
        "phases": step_phases(rows),
        "reward": [r["reward/mean"] for r in rows],
        "length": [r["length/mean"] for r in rows],
    }


def run_trl(job: Job, out: Path, trl_python: str) -> dict:
    from transformers import AutoTokenizer

    job_file = out / "job.json"
    job_file.write_text(json.dumps(asdict(job)))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    }
    env.pop("VIRTUAL_ENV", None)
    command = [trl_python, str(Path(__file__).resolve()), "--trl-child", str(out)]
    wall, rss, _ = run_child(command, env, out / "log.txt")
    result = json.loads((out / "result.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
    rows = [r["prompt"] for r in step_rows(job, tokenizer)]
    expected = [rows[i : i + job.prompts] for i in range(0, len(rows), job.prompts)]
    if result["prompts"] != expected:
        raise SystemExit(f"TRL trained on other prompts than oncurve; see {out / 'result.json'}")
    return {
        "wall": wall,
        "rss": rss,
        "final": str(out / "final"),
        "seconds": result["seconds"],
        "phases": trl_phases(
            result["seconds"], result["prepare"], result["generate"], result["reward_seconds"]
        ),
        "reward": result["reward"],
        "length": result["length"],
    }


def greedy_accuracy(final: str, test_file: Path, tokens: int) -> float:
    command = [sys.executable, "-m", "oncurve", "eval", "--model", final, "--device", "cpu"]
    command += ["--data", str(test_file)]
    command += ["--max-new-tokens", str(tokens)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"oncurve eval {final} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["accuracy"]


def phase_flops(params: int, job: Job, prompt_tokens: float, mean_length: float) -> dict:
    """The FLOP floor of each phase of a step that has one: 2N per generated token, 2N per
    reference token (beta > 0), 6N per trained token (mu passes); the reference and training
    forwards see prompt and completion tokens. Keyed by both trainers' phase names."""
    rows = job.prompts * job.group
    generated = rows * mean_length
    sequence = prompt_tokens + generated
    generation = 2 * params * generated
    return {
        "rollout": generation,
        "generate": generation,
        "reference": 2 * params * sequence if job.beta > 0 else 0.0,
        "train": 6 * params * sequence * job.mu,
    }


def flops_per_step(params: int, job: Job, prompt_tokens: float, mean_length: float) -> float:
    """The FLOP floor of a whole step: the sum of `phase_flops` (generation counted once)."""
    phases = phase_flops(params, job, prompt_tokens, mean_length)
    return phases["rollout"] + phases["reference"] + phases["train"]


def benchmark(name: str, args: argparse.Namespace) -> str:
    import transformers

    from oncurve.model.kv_cache import microbatch_tokens
    from oncurve.model.sources import load_tokenizer

    prompts, group, tokens, force, steps, microbatch = SCENARIOS.get(name, SCENARIOS["default"])
    path = model_dir(name)
    job = Job(
        model_dir=str(path),
        prompts=args.prompts or prompts,
        group=args.group or group,
        tokens=args.tokens or tokens,
        force_length=force,
        lr=args.lr,
        beta=args.beta,
        epsilon=args.epsilon,
        mu=args.mu,
        steps=args.steps or steps,
        seed=0,
        microbatch=args.microbatch or microbatch,
        gradient_checkpointing=args.gradient_checkpointing,
        adam_beta1=0.9,
        adam_beta2=0.99,
        grad_clip=1.0,
    )
    trl_versions = ensure_trl_venv()
    trl_python = str(TRL_VENV / "bin" / "python")
    work = CACHE / "runs" / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    test_file = work / "test.jsonl"
    subprocess.run(
        [sys.executable, "-m", "oncurve", "tasks", "export", "arith", "--split", "test"]
        + ["-n", str(args.eval_n), "-o", str(test_file)],
        check=True,
    )
    config = transformers.AutoConfig.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_config(config)
    params = model.num_parameters()
    token_cap = microbatch_tokens(model, None)
    tokenizer = load_tokenizer(path)
    prompt_tokens = [
        sum(len(r["prompt_ids"]) for r in step_rows(Job(**{**asdict(job), "seed": run}), tokenizer))
        * job.group
        / job.steps
        for run in range(args.runs)
    ]
    seq = int(job.prompts * job.group * (job.tokens + 12))
    rate_shapes = [
        (2048, 1024, 1024),
        (min(seq, 8192), config.hidden_size, config.intermediate_size),
    ]
    rate = max(matmul_gflops(*shape) for shape in rate_shapes)
    load_before = load_note()
    results: dict[str, list[dict]] = {"oncurve": [], "TRL": []}
    for run in range(args.runs):
        run_job = Job(**{**asdict(job), "seed": run})
        for label in ("oncurve", "TRL"):
            out = work / f"{label}-{run}"
            out.mkdir()
            print(f"[{name}] run {run + 1}/{args.runs}: {label} ...", flush=True)
            if label == "oncurve":
                result = run_oncurve(run_job, out)
            else:
                result = run_trl(run_job, out, trl_python)
            result["accuracy"] = greedy_accuracy(result["final"], test_file, job.tokens)
            result["prompt_tokens"] = prompt_tokens[run]
            median = statistics.median(result["seconds"][1:] or result["seconds"])
            print(
                f"  {median:.2f} s/step, peak RSS {result['rss']:.0f} MB, "
                f"final reward {result['reward'][-1]:.3f}, accuracy {result['accuracy']:.1%}",
                flush=True,
            )
            results[label].append(result)
    rate = max(rate, max(matmul_gflops(*shape) for shape in rate_shapes))
    machine = {
        "rate": rate,
        "shapes": rate_shapes,
        "token_cap": token_cap,
        "trl": trl_versions,
        "load": f"{load_before} before, {load_note()} after",
    }
    return report(name, job, params, machine, results, args)


def report(
    name: str,
    job: Job,
    params: int,
    machine: dict,
    results: dict[str, list[dict]],
    args: argparse.Namespace,
) -> str:
    """The markdown section of one model: summary table, targets, phases, runs, unmatched."""
    rate = machine["rate"]

    def steady(label: str) -> list[float]:
        return [s for r in results[label] for s in r["seconds"][1:]]

    stats = {}
    for label, runs in results.items():
        seconds = statistics.median(steady(label))
        length = statistics.mean(x for r in runs for x in r["length"])
        prompt_tokens = statistics.mean(r["prompt_tokens"] for r in runs)
        floor = flops_per_step(params, job, prompt_tokens, length) / (rate * 1e9)
        phase_floors = {
            phase: flops / (rate * 1e9)
            for phase, flops in phase_flops(params, job, prompt_tokens, length).items()
        }
        stats[label] = {
            "seconds": seconds,
            "rss": max(r["rss"] for r in runs),
            "final_reward": statistics.mean(r["reward"][-1] for r in runs),
            "mean_reward": statistics.mean(x for r in runs for x in r["reward"]),
            "accuracy": statistics.mean(r["accuracy"] for r in runs),
            "length": length,
            "floor": floor,
            "phase_floors": phase_floors,
        }
    header = [
        "trainer",
        "median s/step",
        "vs TRL",
        "peak RSS MB",
        "vs TRL",
        "mean length",
        "FLOP floor s",
        "x floor",
        f"reward at step {job.steps}",
        "reward, all steps",
        f"greedy acc. ({args.eval_n} held out)",
    ]
    base = stats["TRL"]
    rows = [
        [
            label,
            f"{s['seconds']:.3f}",
            f"{s['seconds'] / base['seconds']:.2f}x",
            f"{s['rss']:,.0f}",
            f"{s['rss'] / base['rss']:.2f}x",
            f"{s['length']:.1f}",
            f"{s['floor']:.3f}",
            f"{s['seconds'] / s['floor']:.1f}x",
            f"{s['final_reward']:.3f}",
            f"{s['mean_reward']:.3f}",
            f"{s['accuracy']:.1%}",
        ]
        for label, s in stats.items()
    ]
    target = TARGETS.get(name, 0.8)
    ratio = stats["oncurve"]["seconds"] / base["seconds"]
    memory = stats["oncurve"]["rss"] / base["rss"]
    accuracy = (stats["oncurve"]["accuracy"], base["accuracy"])
    p = sum(accuracy) / 2
    noise = 2 * (p * (1 - p) / args.eval_n) ** 0.5
    verdict = (
        f"Targets: oncurve s/step <= {target}x TRL's: **{ratio:.2f}x, "
        f"{'met' if ratio <= target else 'missed'}**; peak RSS <= TRL's: **{memory:.2f}x, "
        f"{'met' if memory <= 1 else 'missed'}**; held-out accuracy {accuracy[0]:.1%} vs "
        f"{accuracy[1]:.1%} (two binomial standard errors of one {args.eval_n}-prompt "
        f"evaluation: {noise:.1%})."
    )
    phase_rows = []
    for label in results:
        for phase in results[label][0]["phases"]:
            values = [x for r in results[label] for x in r["phases"][phase][1:]]
            median = statistics.median(values)
            floor = stats[label]["phase_floors"].get(phase)
            phase_rows.append(
                [
                    label,
                    phase,
                    f"{median:.3f}",
                    f"{median / stats[label]['seconds']:.0%}",
                    f"{median / floor:.1f}x" if floor else "",
                ]
            )
    per_run = [
        [
            label,
            str(i + 1),
            " ".join(f"{s:.2f}" for s in r["seconds"]),
            f"{r['rss']:,.0f}",
            f"{r['wall']:.0f}",
            f"{r['accuracy']:.1%}",
        ]
        for i in range(args.runs)
        for label in results
        for r in [results[label][i]]
    ]
    unmatched = [
        "prompt batches are identical (TRL reads oncurve's per-step order, shuffle off), but "
        "each trainer draws its own samples from its own RNG, so completions and rewards differ",
        "TRL recomputes nothing at mu=1 and uses detached current logprobs as pi_old; oncurve "
        "does the same (ratio 1 exactly); both compute the reference forward when beta > 0",
        "TRL: loss_type=grpo (per-sequence token mean, then mean; with gradient accumulation it "
        "divides each microbatch's mean by the accumulation steps, equal to oncurve's "
        "seq-mean-token-mean when microbatches hold equal rows), scale_rewards=group, "
        "mask_truncated_completions=false, multi_objective_aggregation=sum_then_normalize, "
        "top_entropy_quantile=1, importance_sampling_level=token",
        f"gradient checkpointing: {'on' if job.gradient_checkpointing else 'off'} in both "
        "(TRL's default is on; oncurve's is off)",
        "TRL's group std is torch's unbiased std (N-1) with eps 1e-4 added; oncurve's is the "
        "population std with eps 1e-6: advantages differ by a constant factor sqrt((G-1)/G)",
        "KL: both k3 in the loss with beta; TRL's per-token KL and oncurve's are the same "
        "estimator",
        "step time: oncurve's time/step (rollout + reward + reference + train, from "
        "metrics.jsonl); TRL's on_step_begin to on_step_end (generation, reward, reference "
        "forward, microbatches, optimizer step); neither includes logging",
        f"microbatch: {min(job.microbatch, job.prompts * job.group)} rows per forward/backward "
        "in both (TRL: per_device_train_batch_size with gradient accumulation); oncurve also "
        f"caps a microbatch at {machine['token_cap']:,} padded tokens (its CPU default, 16 MB "
        "per activation of this model's width), TRL has no token cap",
    ]
    if job.force_length:
        unmatched.append(
            "completions forced to full length in both (oncurve rollout.min_new_tokens, TRL "
            "generation_kwargs min_new_tokens)"
        )
    command = (
        f"python benchmarks/vs_trl.py --model {name} --steps {job.steps} --runs {args.runs} "
        f"--microbatch {job.microbatch}"
    )
    shapes = ", ".join("x".join(map(str, shape)) for shape in machine["shapes"])
    return (
        f"### {name}: {params / 1e6:.2f}M params, {job.prompts} prompts x G={job.group}, "
        f"{job.tokens} tokens, {job.steps} steps x {args.runs} runs per trainer\n\n"
        f"Measured {time.strftime('%Y-%m-%d')} on {cpu_name()}, {os.cpu_count()} cores, torch "
        f"threads {torch_threads()}; `{command}`; TRL's venv: {machine['trl']}; oncurve's: "
        f"transformers {transformers_version()}; lr {job.lr}, beta {job.beta}, "
        f"epsilon {job.epsilon}, mu {job.mu}, fp32. FLOP floor at {rate:.1f} GFLOP/s (fp32 "
        f"matmul, best of [m, k] x [k, n] at {shapes}); {machine['load']}.\n\n"
        + markdown_table(header, rows)
        + f"\n\n{verdict}\n\nMedian seconds per phase (steps after the first), and each "
        "phase over its own FLOP floor (generation 2N, reference 2N, train 6N per token):\n\n"
        + markdown_table(["trainer", "phase", "median s", "share of step", "x floor"], phase_rows)
        + "\n\nPer run (steps in order; wall includes start-up and saving):\n\n"
        + markdown_table(["trainer", "run", "s per step", "peak RSS MB", "wall s", "acc."], per_run)
        + "\n\nSettings that cannot be matched or are matched by hand:\n\n"
        + "\n".join(f"- {item}" for item in unmatched)
        + "\n"
    )


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="default | tiny | 30m | PATH")
    parser.add_argument("--steps", type=int, help="steps per run (default: per model)")
    parser.add_argument("--runs", type=int, default=2, help="runs per trainer, alternating")
    parser.add_argument("--prompts", type=int, help="prompts per step (default: per model)")
    parser.add_argument("--group", type=int, help="G (default: per model)")
    parser.add_argument("--tokens", type=int, help="completion tokens (default: per model)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--epsilon", type=float, default=0.2)
    parser.add_argument("--mu", type=int, default=1)
    parser.add_argument("--eval-n", type=int, default=200, help="held-out prompts scored")
    parser.add_argument(
        "--microbatch", type=int, help="rows per forward/backward (default: per model)"
    )
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="on in both (TRL's default)"
    )
    parser.add_argument("--trl-child", help=argparse.SUPPRESS)  # run TRL, write into this dir
    args = parser.parse_args()
    if args.trl_child:
        out = Path(args.trl_child)
        trl_child(Job(**json.loads((out / "job.json").read_text())), out)
        return
    section = benchmark(args.model, args)
    print("\n" + section, flush=True)
    write_section(RESULTS, TITLE, args.model, section)


if __name__ == "__main__":
    main()
