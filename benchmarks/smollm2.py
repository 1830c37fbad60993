"""SmolLM2-135M-Instruct RL-fine-tuned on 2 CPU cores: held-out accuracy over time, oncurve and
TRL's GRPOTrainer on the same job (`harness.spec.Job` of configs/smollm2_135m.yaml; what is held
equal and what the page gives: benchmarks/README.md), every model scored by the trainer's
evaluation (`harness.learning.held_out`).

    make smollm2                                   # once: fetch and import the model
    .venv/bin/python benchmarks/smollm2.py --trl-steps 15   # TRL bounded to about 20 minutes
    .venv/bin/python benchmarks/smollm2.py --skip-trl
"""

from __future__ import annotations

import argparse
import statistics
from itertools import accumulate

from harness import learning
from harness.checkout import CACHE, RESULTS, ROOT
from harness.machine import load_note
from harness.spec import Job
from harness.tables import markdown_table, publish
from harness.trl_env import ensure_trl_venv, run_trl, trl_env

NAME = "smollm2"
CONFIG = ROOT / "configs" / "smollm2_135m.yaml"
CURVE = RESULTS / "smollm2.png"
SAMPLES = 4  # completions shown before and after


def held_out(model_dir: str, job: Job) -> tuple[float, list[dict]]:
    """The model's held-out accuracy and its first `SAMPLES` greedy completions."""
    result, rows, records = learning.held_out(model_dir, job.config())
    shown = zip(rows[:SAMPLES], records, strict=False)
    return result["accuracy"], [
        {"prompt": r["prompt"], "answer": r["answer"], "completion": x["greedy"]} for r, x in shown
    ]


def plot(trainers: dict[str, dict], before: float) -> None:
    """Held-out accuracy and the sampled `correct` reward against training seconds, `CURVE`."""
    evals = [(f"{n} (its evaluations)", [e[1] for e in r["evals"]], [e[2] for e in r["evals"]], {})
             for n, r in trainers.items() if r.get("evals")]  # fmt: skip
    finals = {f"{n}: final": (sum(r["seconds"]), r["after"]) for n, r in trainers.items()}
    rewards = [(n, list(accumulate(r["seconds"])), r["reward"], {}) for n, r in trainers.items()]
    learning.plot(CURVE, [
        {"title": "held-out", "x": "training seconds", "y": "held-out greedy accuracy",
         "lines": evals, "points": finals, "base": before},
        {"title": "training", "x": "training seconds", "y": "reward/correct (sampled)",
         "lines": rewards},
    ])  # fmt: skip


def section(row: dict) -> str:
    """The page of one row: the table, oncurve's curve, what the model writes."""
    before = row["before"]
    table = [
        [name, str(r["steps"]), f"{r['s_per_step']:.1f}", f"{r['wall_s'] / 60:.1f}",
         f"{r['rss_mb']:.0f}", f"{before:.1%}", f"{r['after']:.1%}",
         f"{100 * (r['after'] - before):+.1f}"]
        for name, r in row["trainers"].items()
    ]  # fmt: skip
    header = ["trainer", "steps", "s/step (median)", "wall min", "peak RSS MB", "before",
              "after", "points"]  # fmt: skip
    curve = ", ".join(f"{t:.0f} s {a:.1%}" for _, t, a in row["trainers"]["oncurve"]["evals"])
    shown = [("before", row["before_samples"])]
    shown += [(f"after, {name}", r["samples"]) for name, r in row["trainers"].items()]
    samples = "".join(
        f"\n{label}:\n\n"
        + "\n".join(f"- {x['prompt']} (answer {x['answer']}) -> {x['completion']!r}" for x in xs)
        + "\n"
        for label, xs in shown
    )
    at = f" at {row['commit']}" if row["commit"] else ""
    return (
        f"# {row['title']}\n\nWritten by `benchmarks/smollm2.py` on {row['date']}{at}: "
        f"{learning.describe(row['settings'])}; held-out: greedy on every test problem. Load: "
        f"{row['load_before']}; after: {row['load_after']}.\n\n{markdown_table(header, table)}"
        f"\n\noncurve's held-out accuracy during training (training seconds, accuracy): {curve}. "
        f"Curve: `{CURVE.name}`.\n\n## What the model writes\n{samples}"
    )


def summary(row: dict) -> str:
    """The row in one line: held-out accuracy before and after each trainer, s/step, wall."""
    parts = [f"{name} {row['before']:.0%} -> {r['after']:.0%} held-out in {r['steps']} steps, "
             f"{r['s_per_step']:.1f} s/step, {r['wall_s'] / 60:.1f} min"
             for name, r in row["trainers"].items()]  # fmt: skip
    return "SmolLM2-135M-Instruct on `sums`: " + "; ".join(parts)


def headline(row: dict) -> dict[str, str]:
    """The README's row for an instruct model: oncurve's held-out accuracy before and after,
    TRL's after the same steps and oncurve's s/step against TRL's when TRL ran."""
    ours = row["trainers"]["oncurve"]
    figure = (
        f"SmolLM2-135M-Instruct {row['before']:.0%} -> {ours['after']:.0%} held-out in "
        f"{ours['steps']} steps"
    )
    if trl := row["trainers"].get("TRL"):
        ratio = ours["s_per_step"] / trl["s_per_step"]
        figure += f"; TRL {trl['after']:.0%}, at {ratio:.2f}x its s/step"
    return {"area": "an instruct model, 2 CPU cores", "figure": figure,
            "command": "benchmarks/smollm2.py"}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="training steps (default: the config's)")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument(
        "--trl-steps", type=int, help="TRL's steps (default: the same); fewer bound its wall time"
    )
    args = parser.parse_args()
    from oncurve.config import load_config

    config = load_config(CONFIG)  # the job, the same for both trainers
    learning.require(ROOT / config.model.path / "config.json")
    model_dir = str(ROOT / config.model.path)
    settings = {"model.path": model_dir, "run.device": "cpu"}
    settings["run.steps"] = args.steps or config.run.steps
    job = Job(settings, config_file=str(CONFIG), reward_task="sums", trl_microbatch=16)
    load_before = load_note()
    before, before_samples = held_out(model_dir, job)
    trainers: dict[str, dict] = {}
    for name in ("oncurve",) if args.skip_trl else ("oncurve", "TRL"):
        out = CACHE / NAME / name
        print(f"{name} ...", flush=True)
        if name == "oncurve":
            own, done = job, learning.train(job.oncurve_args(), out)
        else:
            own = job.with_settings(run__steps=args.trl_steps or job.settings["run.steps"])
            python = ensure_trl_venv()
            trl = run_trl(own, out, python, trl_env(python), save=True)
            done = {"wall_s": round(trl["wall"], 1), "rss_mb": round(trl["rss"]),
                    "seconds": trl["seconds"], "reward": trl["rewards"]["correct"],
                    "s_per_step": statistics.median(trl["seconds"][1:]), "phases": trl["phases"],
                    "final": trl["final"]}  # fmt: skip
        after, samples = held_out(done.pop("final"), job)
        trainers[name] = done | {"steps": own.settings["run.steps"], "after": after}
        trainers[name]["samples"] = samples
        print(f"{name}: {after:.1%} after {trainers[name]['steps']} steps", flush=True)
    plot(trainers, before)
    row = {"renderer": NAME, "settings": learning.settings(job.config()), "before": before,
           "load_before": load_before, "load_after": load_note(),
           "before_samples": before_samples, "trainers": trainers}  # fmt: skip
    publish(NAME, "SmolLM2-135M-Instruct on `sums`, 2 CPU cores", "", row)


if __name__ == "__main__":
    main()
