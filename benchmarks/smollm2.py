"""SmolLM2-135M-Instruct RL-fine-tuned on 2 CPU cores: held-out accuracy over time, oncurve and
TRL's GRPOTrainer on the same job in one run (configs/smollm2_135m.yaml).

The job: the `sums` task ("What is 37 + 8? Put the final answer in \\boxed{}.") in the model's
chat template, 8 prompts x G=8 a step, 32 new tokens, lr 2e-5 decayed by a cosine to 0, beta 0,
10 steps (the recipe's schedule, which TRL gets too). Both trainers get the same model
directory, the same prompt rows in the same order (TRL's dataset is oncurve's per-step order,
rendered with the chat template, shuffling off) and the task's rewards with their weights.
Held-out accuracy is one function for every model (the base, each final model, and oncurve's
own evaluations every 5 steps): greedy, 32 tokens, the task's
`correct` reward on all 50 held-out problems. The table gives seconds per step (median, the
first step left out), each run's wall time, accuracy before and after; the curve is accuracy
against training seconds; a few completions before and after show what changed.

    make smollm2                                   # once: fetch and import the model
    .venv/bin/python benchmarks/smollm2.py         # both trainers (about 20 minutes)
    .venv/bin/python benchmarks/smollm2.py --trl-steps 15   # TRL bounded to about 20 minutes
    .venv/bin/python benchmarks/smollm2.py --skip-trl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.children import run_child
from harness.machine import load_note
from harness.run_logs import step_phases
from harness.tables import markdown_table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CONFIG = ROOT / "configs" / "smollm2_135m.yaml"
CACHE = HERE / ".cache" / "smollm2"
RESULTS = HERE / "results" / "smollm2.md"
CURVE = HERE / "results" / "smollm2.png"
TRL_VENV = HERE / ".venv-trl"
SAMPLES = 4  # completions shown before and after


@dataclass
class Job:
    """The settings both trainers get, read from the recipe's config."""

    model_dir: str
    prompts: int
    group: int
    tokens: int
    lr: float
    schedule: str
    warmup: int
    beta: float
    steps: int
    seed: int


def load_job(steps: int | None) -> Job:
    from oncurve.config import load_config

    c = load_config(CONFIG)
    return Job(
        model_dir=str(ROOT / c.model.path),
        prompts=c.data.prompts_per_step,
        group=c.rollout.group_size,
        tokens=c.rollout.max_new_tokens,
        lr=c.optim.lr,
        schedule=c.optim.schedule,
        warmup=c.optim.warmup_steps,
        beta=c.algo.beta,
        steps=steps or c.run.steps,
        seed=c.run.seed,
    )


def step_rows(job: Job, tokenizer) -> list[dict]:
    """The rows oncurve's trainer draws for steps 1..steps, in order, with their prompt ids."""
    from oncurve.config import load_config
    from oncurve.data.prompts import PromptData
    from oncurve.data.tasks import get_task

    data = load_config(CONFIG).data
    rows = get_task("sums").examples("train", data.num_train, job.seed)
    ordered = PromptData(rows, tokenizer, data, seed=job.seed)
    return [row for step in range(1, job.steps + 1) for row in ordered.batch(step, job.prompts)]


def render(tokenizer, prompt: str) -> str:
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


# --- the TRL child (runs in .venv-trl) ---------------------------------------------------------


def trl_child(job: Job, out_dir: Path) -> None:
    import torch
    from datasets import Dataset
    from harness.trl_child import train_trl_timed, trl_reward
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from oncurve.data.tasks import get_task

    tokenizer = AutoTokenizer.from_pretrained(job.model_dir)
    rows = step_rows(job, tokenizer)
    texts = [render(tokenizer, row["prompt"]) for row in rows]
    for text, row in zip(texts, rows, strict=True):
        if tokenizer(text=text)["input_ids"] != row["prompt_ids"]:
            raise SystemExit(f"TRL would tokenize {text!r} otherwise than oncurve")
    dataset = Dataset.from_list(
        [{"prompt": text, "answer": row["answer"]} for text, row in zip(texts, rows, strict=True)]
    )
    task = get_task("sums")
    fns = task.reward_fns()
    args = GRPOConfig(
        output_dir=str(out_dir / "trainer"),
        use_cpu=True,
        bf16=False,
        model_init_kwargs={"dtype": torch.float32},
        per_device_train_batch_size=16,
        gradient_accumulation_steps=job.prompts * job.group // 16,
        num_generations=job.group,
        max_completion_length=job.tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=job.lr,
        lr_scheduler_type="cosine" if job.schedule == "cosine" else "constant_with_warmup",
        warmup_steps=job.warmup,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        max_grad_norm=1.0,
        beta=job.beta,
        epsilon=0.2,
        num_iterations=1,
        loss_type="grpo",
        scale_rewards="group",
        mask_truncated_completions=False,
        reward_weights=[task.reward_weights[name] for name in fns],
        shuffle_dataset=False,
        max_steps=job.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=job.seed,
        dataloader_num_workers=0,
    )
    seen: list[list[str]] = []
    funcs = [trl_reward(name, fn, job.group, seen) for name, fn in fns.items()]
    trainer, _, seconds = train_trl_timed(args, job.model_dir, funcs, dataset, tokenizer)
    trainer.save_model(str(out_dir / "final"))
    tokenizer.save_pretrained(str(out_dir / "final"))
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    result = {
        "seconds": seconds,
        "correct": [entry.get("rewards/correct/mean", float("nan")) for entry in logs],
    }
    (out_dir / "result.json").write_text(json.dumps(result))


# --- the parent (runs in oncurve's .venv) ------------------------------------------------------


def held_out(model_dir: str, count: int | None = None) -> tuple[float, list[dict]]:
    """Greedy held-out accuracy of a model directory on the task's test problems (the trainer's
    evaluation: chat template, `rollout.max_new_tokens`, the `correct` reward), and the first
    `SAMPLES` completions."""
    from oncurve.config import load_config
    from oncurve.data.prompts import PromptData
    from oncurve.data.tasks import get_task
    from oncurve.loop.evaluate import evaluate
    from oncurve.model.sources import load_model, load_tokenizer
    from oncurve.rollout import SamplingParams, build_sampler

    config = load_config(CONFIG)
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, "float32", "cpu").eval()
    task = get_task("sums")
    rows = task.examples("test", count or config.eval.num_prompts, config.run.seed)
    data = PromptData(rows, tokenizer, config.data, seed=config.run.seed)
    sampler = build_sampler("auto", model, tokenizer)
    tokens = config.rollout.max_new_tokens
    accuracy = evaluate(sampler, data.rows, task.reward_fns()["correct"], max_new_tokens=tokens)
    shown = data.rows[:SAMPLES]
    batch = sampler.generate_ids(
        [r["prompt_ids"] for r in shown], 1, SamplingParams(max_new_tokens=tokens, temperature=0)
    )
    samples = [
        {"prompt": r["prompt"], "answer": r["answer"], "completion": text}
        for r, text in zip(shown, batch.texts, strict=True)
    ]
    return accuracy["accuracy"], samples


def run_oncurve(job: Job, out: Path) -> dict:
    from oncurve.run.metrics import read_jsonl

    command = [sys.executable, "-m", "oncurve", "train", str(CONFIG), "--quiet"]
    command += [f"run.dir={out / 'run'}", "run.overwrite=true", "run.device=cpu"]
    command += [f"run.steps={job.steps}", f"model.path={job.model_dir}"]
    wall, rss, _ = run_child(command, dict(os.environ), out / "log.txt")
    rows = read_jsonl(out / "run" / "metrics.jsonl")
    steps = [r for r in rows if "time/step" in r]
    elapsed, curve = 0.0, []
    for r in rows:
        elapsed += r.get("time/step", 0.0)
        if "eval/accuracy" in r:
            curve.append((elapsed, r["eval/accuracy"]))
    return {
        "wall": wall,
        "rss": rss,
        "final": str(out / "run" / "final"),
        "seconds": [r["time/step"] for r in steps],
        "phases": step_phases(steps),
        "correct": [r["reward/correct"] for r in steps],
        "curve": curve,
    }


def run_trl(job: Job, out: Path) -> dict:
    (out / "job.json").write_text(json.dumps(asdict(job)))
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}:{HERE}",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("VIRTUAL_ENV", None)
    python = str(TRL_VENV / "bin" / "python")
    if not Path(python).exists():
        raise SystemExit(f"no TRL venv at {TRL_VENV}: run benchmarks/vs_trl.py once to make it")
    command = [python, str(Path(__file__).resolve()), "--trl-child", str(out)]
    wall, rss, _ = run_child(command, env, out / "log.txt")
    result = json.loads((out / "result.json").read_text())
    return {"wall": wall, "rss": rss, "final": str(out / "final"), **result}


def plot(results: dict[str, dict], base: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in results.items():
        times = [sum(r["seconds"][: i + 1]) for i in range(len(r["seconds"]))]
        right.plot(times, r["correct"], label=name)
        if "curve" in r:
            left.plot(*zip(*r["curve"], strict=True), marker="o", label=f"{name} (its evaluations)")
        left.scatter([sum(r["seconds"])], [r["after"]], marker="x", s=80, label=f"{name}: final")
    left.axhline(base, color="grey", linestyle=":", label="base model")
    left.set(xlabel="training seconds", ylabel="held-out greedy accuracy", title="held-out")
    right.set(xlabel="training seconds", ylabel="reward/correct (sampled)", title="training")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(CURVE, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="training steps (default: the config's)")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument(
        "--trl-steps", type=int, help="TRL's steps (default: the same); fewer bound its wall time"
    )
    parser.add_argument("--trl-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_child:
        out = Path(args.trl_child)
        trl_child(Job(**json.loads((out / "job.json").read_text())), out)
        return
    job = load_job(args.steps)
    if not (Path(job.model_dir) / "config.json").is_file():
        raise SystemExit(f"no model in {job.model_dir}: run `make smollm2` first")
    load_before = load_note()
    base, base_samples = held_out(job.model_dir)
    results: dict[str, dict] = {}
    runners = {"oncurve": run_oncurve} | ({} if args.skip_trl else {"TRL": run_trl})
    for name, runner in runners.items():
        out = CACHE / name
        out.mkdir(parents=True, exist_ok=True)
        print(f"{name} ...", flush=True)
        own = (
            job
            if name == "oncurve"
            else dataclasses.replace(job, steps=args.trl_steps or job.steps)
        )
        results[name] = runner(own, out)
        results[name]["steps"] = own.steps
        results[name]["after"], results[name]["samples"] = held_out(results[name]["final"])
        print(f"{name}: {results[name]['after']:.1%} after {own.steps} steps", flush=True)
    plot(results, base)
    rows = [
        [
            name,
            str(r["steps"]),
            f"{statistics.median(r['seconds'][1:]):.1f}",
            f"{r['wall'] / 60:.1f}",
            f"{r['rss']:.0f}",
            f"{base:.1%}",
            f"{r['after']:.1%}",
            f"{100 * (r['after'] - base):+.1f}",
        ]
        for name, r in results.items()
    ]
    header = [
        "trainer",
        "steps",
        "s/step (median)",
        "wall min",
        "peak RSS MB",
        "before",
        "after",
        "points",
    ]
    curve = results["oncurve"]["curve"]
    lines = [
        "# SmolLM2-135M-Instruct on `sums`, 2 CPU cores\n",
        f"Written by `benchmarks/smollm2.py` on {time.strftime('%Y-%m-%d')}: {job.steps} steps of "
        f"{job.prompts} prompts x G={job.group}, {job.tokens} tokens, lr {job.lr} "
        f"({job.schedule}), beta {job.beta}; held-out: greedy on all 50 test problems. Load: {load_before}; after: "
        f"{load_note()}.\n",
        markdown_table(header, rows),
        "\noncurve's held-out accuracy during training (training seconds, accuracy): "
        + ", ".join(f"{s:.0f} s {a:.1%}" for s, a in curve)
        + f". Curve: `{CURVE.name}`.\n",
        "\n## What the model writes\n",
    ]
    for label, samples in [("before", base_samples)] + [
        (f"after, {name}", r["samples"]) for name, r in results.items()
    ]:
        lines.append(f"\n{label}:\n")
        for s in samples:
            lines.append(f"- {s['prompt']} (answer {s['answer']}) -> {s['completion']!r}")
    RESULTS.write_text("\n".join(lines) + "\n")
    print(RESULTS.read_text())


if __name__ == "__main__":
    main()
