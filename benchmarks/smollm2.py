"""SmolLM2-135M-Instruct RL-fine-tuned on 2 CPU cores: held-out accuracy over time, oncurve and
TRL's GRPOTrainer on the same job (`harness.spec.Job` of configs/smollm2_135m.yaml: the `sums`
task in the model's chat template, 8 prompts x G=8, 32 new tokens, lr 2e-5 cosine to 0, beta 0,
10 steps). Held-out accuracy is one function for every model (the base, each final model, and
oncurve's own evaluations every 5 steps): greedy, 32 tokens, the task's `correct` reward on all
50 held-out problems. The page gives seconds per step (median, the first step left out), wall
time, accuracy before and after, the curve against training seconds, and a few completions
before and after.

    make smollm2                                   # once: fetch and import the model
    .venv/bin/python benchmarks/smollm2.py         # both trainers (about 20 minutes)
    .venv/bin/python benchmarks/smollm2.py --trl-steps 15   # TRL bounded to about 20 minutes
    .venv/bin/python benchmarks/smollm2.py --skip-trl
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from harness.checkout import CACHE, RESULTS, ROOT
from harness.children import train_oncurve
from harness.machine import load_note
from harness.spec import Job
from harness.tables import markdown_table, publish
from harness.trl_env import ensure_trl_venv, run_trl, trl_env

CONFIG = ROOT / "configs" / "smollm2_135m.yaml"
CURVE = RESULTS / "smollm2.png"
SAMPLES = 4  # completions shown before and after


def make_job(steps: int | None) -> Job:
    """The recipe's job for both trainers, `steps` long (default: the config's)."""
    from oncurve.config import load_config

    config = load_config(CONFIG)
    settings = {"model.path": str(ROOT / config.model.path), "run.device": "cpu"}
    settings["run.steps"] = steps or config.run.steps
    return Job(settings, config_file=str(CONFIG), reward_task="sums", trl_microbatch=16)


def held_out(model_dir: str) -> tuple[float, list[dict]]:
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
    rows = task.examples("test", config.eval.num_prompts, config.run.seed)
    data = PromptData(rows, tokenizer, config.data, seed=config.run.seed)
    sampler = build_sampler("auto", model, tokenizer)
    tokens = config.rollout.max_new_tokens
    accuracy = evaluate(sampler, data.rows, task.reward_fns()["correct"], max_new_tokens=tokens)
    shown = data.rows[:SAMPLES]
    greedy = SamplingParams(max_new_tokens=tokens, temperature=0)
    batch = sampler.generate_ids([r["prompt_ids"] for r in shown], 1, greedy)
    samples = [
        {"prompt": r["prompt"], "answer": r["answer"], "completion": text}
        for r, text in zip(shown, batch.texts, strict=True)
    ]
    return accuracy["accuracy"], samples


def run_oncurve(job: Job, out: Path) -> dict:
    """oncurve's run: wall, peak RSS, per-step seconds and `correct`, its evaluations as
    (training seconds, accuracy), and the final model."""
    from oncurve.run.metrics import read_jsonl

    done = train_oncurve(job.oncurve_args(), out / "run", out / "log.txt")
    elapsed, curve = 0.0, []
    for r in read_jsonl(out / "run" / "metrics.jsonl"):
        elapsed += r.get("time/step", 0.0)
        if "eval/accuracy" in r:
            curve.append((elapsed, r["eval/accuracy"]))
    steps = done.pop("rows")
    return done | {
        "final": str(out / "run" / "final"),
        "seconds": [r["time/step"] for r in steps],
        "correct": [r["reward/correct"] for r in steps],
        "curve": curve,
    }


def plot(row: dict) -> None:
    """Held-out accuracy and the sampled `correct` reward against training seconds, `CURVE`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in row["trainers"].items():
        times = [sum(r["seconds"][: i + 1]) for i in range(len(r["seconds"]))]
        right.plot(times, r["correct"], label=name)
        if r.get("curve"):
            left.plot(*zip(*r["curve"], strict=True), marker="o", label=f"{name} (its evaluations)")
        left.scatter([sum(r["seconds"])], [r["after"]], marker="x", s=80, label=f"{name}: final")
    left.axhline(row["before"], color="grey", linestyle=":", label="base model")
    left.set(xlabel="training seconds", ylabel="held-out greedy accuracy", title="held-out")
    right.set(xlabel="training seconds", ylabel="reward/correct (sampled)", title="training")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(CURVE, dpi=110)


def section(row: dict) -> str:
    """The page of one row: the table, oncurve's curve, what the model writes."""
    s, before = row["settings"], row["before"]
    table = [
        [name, str(r["steps"]), f"{statistics.median(r['seconds'][1:]):.1f}",
         f"{r['wall'] / 60:.1f}", f"{r['rss']:.0f}", f"{before:.1%}", f"{r['after']:.1%}",
         f"{100 * (r['after'] - before):+.1f}"]
        for name, r in row["trainers"].items()
    ]  # fmt: skip
    header = ["trainer", "steps", "s/step (median)", "wall min", "peak RSS MB", "before",
              "after", "points"]  # fmt: skip
    curve = ", ".join(f"{t:.0f} s {a:.1%}" for t, a in row["trainers"]["oncurve"]["curve"])
    shown = [("before", row["before_samples"])]
    shown += [(f"after, {name}", r["samples"]) for name, r in row["trainers"].items()]
    samples = "".join(
        f"\n{label}:\n\n"
        + "\n".join(f"- {x['prompt']} (answer {x['answer']}) -> {x['completion']!r}" for x in xs)
        + "\n"
        for label, xs in shown
    )
    return (
        f"# {row['title']}\n\nWritten by `benchmarks/smollm2.py` on {row['date']} at "
        f"{row['commit']}: {s['run.steps']} steps of {s['data.prompts_per_step']} prompts x "
        f"G={s['rollout.group_size']}, {s['rollout.max_new_tokens']} tokens, lr {s['optim.lr']} "
        f"({s['optim.schedule']}), beta {s['algo.beta']}; held-out: greedy on all 50 test "
        f"problems. {row['load_note']}.\n\n{markdown_table(header, table)}\n\noncurve's "
        f"held-out accuracy during training (training seconds, accuracy): {curve}. Curve: "
        f"`{CURVE.name}`.\n\n## What the model writes\n{samples}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="training steps (default: the config's)")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument(
        "--trl-steps", type=int, help="TRL's steps (default: the same); fewer bound its wall time"
    )
    args = parser.parse_args()
    job = make_job(args.steps)
    if not (Path(job.settings["model.path"]) / "config.json").is_file():
        raise SystemExit(f"no model in {job.settings['model.path']}: run `make smollm2` first")
    load_before = load_note()
    before, before_samples = held_out(job.settings["model.path"])
    trainers: dict[str, dict] = {}
    for name in ("oncurve",) if args.skip_trl else ("oncurve", "TRL"):
        out = CACHE / "smollm2" / name
        print(f"{name} ...", flush=True)
        if name == "oncurve":
            own, done = job, run_oncurve(job, out)
        else:
            own = job.with_settings(run__steps=args.trl_steps or job.settings["run.steps"])
            python = ensure_trl_venv()
            done = run_trl(own, out, python, trl_env(python), save=True)
            done["correct"] = done["rewards"]["correct"]
        after, samples = held_out(done["final"])
        kept = {k: done[k] for k in ("wall", "rss", "seconds", "correct", "curve") if k in done}
        trainers[name] = kept | {"steps": own.settings["run.steps"], "after": after}
        trainers[name]["samples"] = samples
        print(f"{name}: {after:.1%} after {trainers[name]['steps']} steps", flush=True)
    c = job.config()
    row = {
        "renderer": "smollm2",
        "settings": {"run.steps": c.run.steps, "data.prompts_per_step": c.data.prompts_per_step,
                     "rollout.group_size": c.rollout.group_size, "optim.lr": c.optim.lr,
                     "rollout.max_new_tokens": c.rollout.max_new_tokens,
                     "optim.schedule": c.optim.schedule, "algo.beta": c.algo.beta},
        "load_note": f"Load: {load_before}; after: {load_note()}",
        "before": before,
        "before_samples": before_samples,
        "trainers": trainers,
    }  # fmt: skip
    plot(row)
    publish("smollm2", "SmolLM2-135M-Instruct on `sums`, 2 CPU cores", "", row)


if __name__ == "__main__":
    main()
