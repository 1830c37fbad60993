"""oncurve against TRL's GRPOTrainer on the CPU, the same GRPO job (`harness.spec.Job`): seconds
per step and per phase, peak RSS, reward, and held-out accuracy after the same steps, each
against the step's FLOP floor. The trainers alternate (oncurve, TRL, ...), each run a fresh
process; seconds per step are the median over every run's steps after its first.

    .venv/bin/python benchmarks/vs_trl.py --model default --steps 20 --runs 4
    .venv/bin/python benchmarks/vs_trl.py --model 30m --steps 3 --runs 2
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from harness.checkout import CACHE
from harness.children import export_task, greedy_accuracy, train_oncurve
from harness.machine import cpu_name, load_note, matmul_gflops, torch_threads
from harness.models import model_dir
from harness.run_logs import step_phases
from harness.spec import Job
from harness.tables import markdown_table, publish
from harness.trl_env import ensure_trl_venv, run_trl, trl_env, trl_versions

TITLE = "oncurve vs TRL's GRPOTrainer\n\nWritten by `benchmarks/vs_trl.py`, one section per model."
# model -> (prompts per step, G, completion tokens, force full length, steps, rows per
# forward/backward). At 30M, 64 rows of 144 tokens put every MLP activation over glibc's 32 MB
# mmap threshold and both trainers spend much of the update in page faults: 16 rows is faster.
SCENARIOS = {
    "default": (16, 8, 64, False, 20, 64),
    "tiny": (16, 8, 64, False, 8, 64),
    "30m": (8, 8, 128, True, 4, 16),
}
TARGETS = {"default": 0.6, "tiny": 0.6, "30m": 0.8}  # oncurve s/step <= target x TRL's
# what a row keeps of each run
KEPT = ("seconds", "phases", "rss", "wall", "mean_reward", "length", "accuracy", "prompt_tokens")


def make_job(args: argparse.Namespace) -> Job:
    """The job of `args.model`'s scenario, with what the command line sets."""
    prompts, group, tokens, force, steps, micro = SCENARIOS.get(args.model, SCENARIOS["default"])
    tokens = args.tokens or tokens
    return Job(
        {
            "model.path": str(model_dir(args.model)),
            "model.gradient_checkpointing": args.gradient_checkpointing,
            "data.task": "arith",
            "data.prompts_per_step": args.prompts or prompts,
            "rollout.group_size": args.group or group,
            "rollout.max_new_tokens": tokens,
            "rollout.min_new_tokens": tokens if force else 0,
            "algo.preset": "grpo",
            "algo.beta": args.beta,
            "algo.epsilon": args.epsilon,
            "algo.mu": args.mu,
            "optim.lr": args.lr,
            "optim.warmup_steps": 0,
            "optim.microbatch_size": args.microbatch or micro,
            "eval.at_start_end": False,
            "log.samples_per_step": 0,
            "run.steps": args.steps or steps,
            "run.device": "cpu",  # a CPU benchmark, also on a machine with a GPU
        }
    )


def oncurve_run(job: Job, out: Path) -> dict:
    """oncurve's run of `job` in a fresh child writing into `out`: wall, peak RSS, per-step
    seconds, phases, mean reward and length, and the final model's directory."""
    done = train_oncurve(job.oncurve_args(), out / "run", out / "log.txt")
    steps = done.pop("rows")
    return done | {
        "seconds": [r["time/step"] for r in steps],
        "phases": step_phases(steps),
        "mean_reward": [r["reward/mean"] for r in steps],
        "length": [r["length/mean"] for r in steps],
        "final": out / "run" / "final",
    }


def measure(args: argparse.Namespace) -> dict:
    """Both trainers' runs of the job, alternating; the row's figures."""
    import transformers

    from oncurve.model.kv_cache import microbatch_tokens
    from oncurve.model.sources import load_tokenizer

    job = make_job(args)
    config = job.config()
    python = ensure_trl_venv()
    env = trl_env(python)
    work = CACHE / "vs_trl" / args.model
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    test_file = export_task("arith", "test", args.eval_n, work / "test.jsonl")
    shape = transformers.AutoConfig.from_pretrained(config.model.path)
    model = transformers.AutoModelForCausalLM.from_config(shape)
    tokenizer = load_tokenizer(config.model.path)
    rows = config.data.prompts_per_step * config.rollout.group_size
    shapes = [(2048, 1024, 1024), (min(rows * (config.rollout.max_new_tokens + 12), 8192),
              shape.hidden_size, shape.intermediate_size)]  # fmt: skip
    rate = max(matmul_gflops(*s) for s in shapes)
    load = load_note()
    runs: dict[str, list[dict]] = {"oncurve": [], "TRL": []}
    for run in range(args.runs):
        seeded = job.with_settings(run__seed=run)
        prompt_ids = sum(len(r["prompt_ids"]) for r in seeded.step_rows(tokenizer))
        for label in runs:
            out = work / f"{label}-{run}"
            print(f"[{args.model}] run {run + 1}/{args.runs}: {label} ...", flush=True)
            done = (
                oncurve_run(seeded, out)
                if label == "oncurve"
                else run_trl(seeded, out, python, env, save=True)
            )
            done["accuracy"] = greedy_accuracy(
                done["final"], test_file, config.rollout.max_new_tokens
            )
            done["prompt_tokens"] = prompt_ids * config.rollout.group_size / config.run.steps
            runs[label].append({k: done[k] for k in KEPT})
            print(f"  {statistics.median(done['seconds']):.2f} s/step (median), peak RSS "
                  f"{done['rss']:.0f} MB, accuracy {done['accuracy']:.1%}", flush=True)  # fmt: skip
    rate = max(rate, *(matmul_gflops(*s) for s in shapes))
    return {
        "model": args.model,
        "params": model.num_parameters(),
        "settings": job.settings | {"run.seed": "0..runs-1"},
        "runs_per_trainer": args.runs,
        "eval_n": args.eval_n,
        "target": TARGETS.get(args.model, 0.8),
        "matmul_gflops": rate,
        "matmul_shapes": shapes,
        "token_cap": microbatch_tokens(model, None),
        "cpu": f"{cpu_name()}, torch threads {torch_threads()}",
        "trl_versions": trl_versions(python, env),
        "load_note": f"{load} before, {load_note()} after",
        "runs": runs,
    }


def floors(row: dict, run: dict) -> dict[str, float]:
    """Seconds each phase of a step could take at the matmul rate: 2N per generated and per
    reference token (beta > 0), 6N per trained token (mu passes), with the run's own lengths."""
    s, n = row["settings"], row["params"]
    generated = (
        s["data.prompts_per_step"] * s["rollout.group_size"] * statistics.mean(run["length"])
    )
    tokens = run["prompt_tokens"] + generated
    flops = {"generate": 2 * n * generated, "reference": 2 * n * tokens if s["algo.beta"] else 0}
    flops |= {"rollout": flops["generate"], "train": 6 * n * tokens * s["algo.mu"]}
    return {phase: f / (row["matmul_gflops"] * 1e9) for phase, f in flops.items()}


def summarize(row: dict, runs: list[dict]) -> dict:
    """One trainer's figures over its runs: median s/step after each run's first step, peak
    RSS, mean length, FLOP floors, rewards and accuracy."""
    floor = {k: statistics.mean(floors(row, r)[k] for r in runs) for k in floors(row, runs[0])}
    return {
        "s": statistics.median(x for r in runs for x in r["seconds"][1:] or r["seconds"]),
        "rss": max(r["rss"] for r in runs),
        "length": statistics.mean(x for r in runs for x in r["length"]),
        "floor": floor["rollout"] + floor["reference"] + floor["train"],
        "phase_floor": floor,
        "last": statistics.mean(r["mean_reward"][-1] for r in runs),
        "all": statistics.mean(x for r in runs for x in r["mean_reward"]),
        "acc": statistics.mean(r["accuracy"] for r in runs),
        "phases": {
            phase: statistics.median(x for r in runs for x in r["phases"][phase][1:])
            for phase in runs[0]["phases"]
        },
    }


def section(row: dict) -> str:
    """The markdown section of one row: summary, targets, phases, runs."""
    s, n = row["settings"], row["eval_n"]
    stats = {label: summarize(row, runs) for label, runs in row["runs"].items()}
    base, ours = stats["TRL"], stats["oncurve"]
    summary = [
        [label, f"{t['s']:.3f}", f"{t['s'] / base['s']:.2f}x", f"{t['rss']:,.0f}",
         f"{t['rss'] / base['rss']:.2f}x", f"{t['length']:.1f}", f"{t['floor']:.3f}",
         f"{t['s'] / t['floor']:.1f}x", f"{t['last']:.3f}", f"{t['all']:.3f}", f"{t['acc']:.1%}"]
        for label, t in stats.items()
    ]  # fmt: skip
    phases = [
        [label, phase, f"{m:.3f}", f"{m / t['s']:.0%}",
         f"{m / t['phase_floor'][phase]:.1f}x" if t["phase_floor"].get(phase) else ""]
        for label, t in stats.items()
        for phase, m in t["phases"].items()
    ]  # fmt: skip
    per_run = [
        [label, str(i + 1), " ".join(f"{x:.2f}" for x in r["seconds"]), f"{r['rss']:,.0f}",
         f"{r['wall']:.0f}", f"{r['accuracy']:.1%}"]
        for i in range(row["runs_per_trainer"])
        for label, runs in row["runs"].items()
        for r in [runs[i]]
    ]  # fmt: skip
    ratio, memory = ours["s"] / base["s"], ours["rss"] / base["rss"]
    p = (ours["acc"] + base["acc"]) / 2
    header = ["trainer", "median s/step", "vs TRL", "peak RSS MB", "vs TRL", "mean length",
              "FLOP floor s", "x floor", f"reward at step {s['run.steps']}", "reward, all steps",
              f"greedy acc. ({n} held out)"]  # fmt: skip
    verdict = (
        f"Targets: oncurve s/step <= {row['target']}x TRL's: **{ratio:.2f}x, "
        f"{'met' if ratio <= row['target'] else 'missed'}**; peak RSS <= TRL's: **{memory:.2f}x, "
        f"{'met' if memory <= 1 else 'missed'}**; held-out accuracy {ours['acc']:.1%} vs "
        f"{base['acc']:.1%} (two binomial standard errors: {2 * (p * (1 - p) / n) ** 0.5:.1%})."
    )
    return (
        f"### {row['model']}: {row['params'] / 1e6:.2f}M params, {s['data.prompts_per_step']} "
        f"prompts x G={s['rollout.group_size']}, {s['rollout.max_new_tokens']} tokens, "
        f"{s['run.steps']} steps x {row['runs_per_trainer']} runs per trainer\n\n"
        f"Measured {row['date']} at {row['commit']} on {row['cpu']}; `{row['command']}`; TRL's "
        f"venv: {row['trl_versions']}; oncurve's: transformers {row['versions']['transformers']}; "
        f"lr {s['optim.lr']}, beta {s['algo.beta']}, epsilon {s['algo.epsilon']}, mu "
        f"{s['algo.mu']}, {s['optim.microbatch_size']} rows per forward/backward (oncurve also "
        f"caps {row['token_cap']:,} tokens), gradient checkpointing "
        f"{'on' if s['model.gradient_checkpointing'] else 'off'}, fp32. FLOP floor at "
        f"{row['matmul_gflops']:.1f} GFLOP/s; {row['load_note']}.\n\n"
        f"{markdown_table(header, summary)}\n\n{verdict}\n\n"
        "Median seconds per phase (steps after the first):\n\n"
        + markdown_table(["trainer", "phase", "median s", "share of step", "x floor"], phases)
        + "\n\nPer run (steps in order; wall includes start-up and saving):\n\n"
        + markdown_table(["trainer", "run", "s per step", "peak RSS MB", "wall s", "acc."], per_run)
        + "\n\nNot matched: each trainer's sampling RNG; TRL's group std is unbiased (N-1, eps "
        "1e-4), oncurve's the population std (eps 1e-6); oncurve's CPU token cap.\n"
    )


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
    parser.add_argument("--microbatch", type=int, help="rows per forward/backward")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="on in both")
    args = parser.parse_args()
    row = measure(args)
    key = args.model if args.model in SCENARIOS else Path(args.model).name
    publish("vs_trl", TITLE, key, {"renderer": "vs_trl", **row})


if __name__ == "__main__":
    main()
