"""GRPO against PPO with a critic on the same job: peak memory, seconds per step, and held-out
greedy accuracy after the same number of steps and after the same wall-clock time.

Both trainers are oncurve (`algo.preset=grpo` and `algo.preset=ppo`, the library's PPO: a value
model that is a second copy of the policy's trunk with a scalar head, its own AdamW, GAE, the
k1 KL to the reference in the reward) on the same model, task (`arith`), prompts per step, G,
completion length, learning rate (passed explicitly, so both use this script's `--lr`), beta,
epsilon, mu, microbatch and steps. They alternate (GRPO, PPO, GRPO, PPO, ...), each run a fresh
subprocess (this script with `--child`, which calls `oncurve.loop.trainer.train`), so the peak
memory is that process's alone: `ru_maxrss` from `os.wait4` (including the Python, torch and
transformers start-up every user pays), and on CUDA `torch.cuda.max_memory_allocated`.

Same wall-clock time: both runs save a checkpoint every `--save-every` steps. The budget is the
faster trainer's training time for all its steps (the sum of its `time/step`: rollout, reward,
reference forward and update, without start-up, saving or logging); the slower trainer is
scored at its newest checkpoint whose cumulative `time/step` fits in that budget (at most one
save interval short of the exact point, so the comparison never favours the slower trainer).

    .venv/bin/python benchmarks/grpo_vs_ppo.py --model 30m     # ~30M params, 8 x 8, 128 tokens
    .venv/bin/python benchmarks/grpo_vs_ppo.py                 # the bundled default, 100 steps
    python3 benchmarks/grpo_vs_ppo.py --model qwen2.5-0.5b --device cuda --eval-n 0

On CUDA (`--device cuda`) the comparison is of `torch.cuda.max_memory_allocated` and of each
run's memory plan (the peak `oncurve train` predicts at start, `oncurve.run.memory_plan`); the model
`qwen2.5-0.5b` is `gpu_vs_trl.py`'s random Qwen2.5-0.5B shape in bf16 (8 x 8, 256 tokens
forced, 2 steps); `--eval-n 0` scores no accuracy (a random model scores 0) and `--json PATH`
also writes each trainer's peaks and seconds as JSON (what `gpu_check.py` reads).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from harness.checkout import CACHE, checkout_env
from harness.children import export_task, greedy_accuracy, own_peak_rss, run_child
from harness.machine import cpu_name, load_note, torch_threads
from harness.models import SHAPES, build_model, model_dir, tokenizer_dir
from harness.run_logs import planned_peak_gb, step_phases
from harness.spec import Job
from harness.tables import cell, markdown_table, publish

WORK = CACHE / "grpo_vs_ppo"
TITLE = (
    "GRPO vs PPO with a critic\n\nWritten by `benchmarks/grpo_vs_ppo.py`, one section per model "
    "and setting."
)
TRAINERS = ("GRPO", "PPO")
PRESET = {"GRPO": "grpo", "PPO": "ppo"}


# model -> (prompts per step, G, completion tokens, force full length, steps, save every)
SCENARIOS = {
    "default": (16, 8, 64, False, 100, 5),
    "tiny": (16, 8, 64, False, 8, 2),
    "30m": (8, 8, 128, True, 3, 1),
    "qwen2.5-0.5b": (8, 8, 256, True, 2, 2),  # gpu_vs_trl.py's job size, on a GPU
}
TARGET = 0.70  # GRPO peak memory <= TARGET x PPO's (issue 7, on the ~30M model)


def make_job(name: str, args: argparse.Namespace) -> Job:
    """GRPO's job of model `name`'s scenario with what the command line sets; PPO's differs only
    in `algo.preset` (`Job.with_settings`)."""
    prompts, group, tokens, force, steps, save_every = SCENARIOS.get(name, SCENARIOS["default"])
    # gpu_vs_trl's shapes carry the Qwen3 tokenizer; the others are vs_trl's
    path = build_model(name, tokenizer_dir(None)) if name in SHAPES else model_dir(name)
    tokens, steps = args.tokens or tokens, args.steps or steps
    save_every = args.save_every or save_every
    return Job({
        "model.path": str(path),
        "model.gradient_checkpointing": args.gradient_checkpointing,
        "data.task": "arith",
        "data.prompts_per_step": args.prompts or prompts,
        "rollout.group_size": args.group or group,
        "rollout.max_new_tokens": tokens,
        "rollout.min_new_tokens": tokens if force or args.force_length else 0,
        "rollout.temperature": 1.0,
        "algo.preset": "grpo",
        "algo.beta": args.beta,
        "algo.epsilon": args.epsilon,
        "algo.mu": args.mu,
        "optim.lr": args.lr,
        "optim.schedule": "constant",
        "optim.microbatch_size": args.microbatch,
        "eval.at_start_end": False,
        "log.samples_per_step": 0,
        "run.steps": steps,
        "run.save_every": save_every,
        "run.keep_last": steps // save_every + 1,
        "run.device": args.device,  # cpu unless --device cuda, also on a machine with a GPU
    })  # fmt: skip


def child(out: Path) -> None:
    """Train the job of `out/job.json` into `out/run`; write the CUDA peak (if any) and this
    process's own peak RSS to `out/child.json`."""
    import torch

    from oncurve.loop.trainer import train

    job = Job.from_json((out / "job.json").read_text())
    train(job.with_settings(run__dir=str(out / "run"), run__overwrite=True).config(), quiet=True)
    cuda = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    (out / "child.json").write_text(json.dumps({"cuda_peak_mb": cuda, "rss_mb": own_peak_rss()}))


def run(job: Job, out: Path) -> dict:
    """One training run in a fresh process; its peak memory, per-step times and metrics."""
    from oncurve.run.metrics import read_jsonl

    run_dir = out / "run"
    (out / "job.json").write_text(job.to_json())
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(out)]
    wall, rss, _ = run_child(command, dict(os.environ), out / "log.txt")
    reported = json.loads((out / "child.json").read_text())
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "time/step" in r]
    return {
        "wall": wall,
        "rss": reported["rss_mb"] or rss,
        "cuda": reported["cuda_peak_mb"],
        "plan_gb": planned_peak_gb((out / "log.txt").read_text()),
        "run_dir": str(run_dir),
        "seconds": [r["time/step"] for r in rows],
        "phases": step_phases(rows),
        "reward": [r["reward/mean"] for r in rows],
        "length": [r["length/mean"] for r in rows],
        "explained_var": [r.get("value/explained_var") for r in rows],
    }


def checkpoint_model(base_dir: str, checkpoint: Path, out: Path) -> Path:
    """A loadable model directory holding a checkpoint's policy weights (the checkpoint keeps
    only weights; config and tokenizer come from the starting model)."""
    from safetensors.torch import load_model as load_weights

    from oncurve.model.saving import save_final
    from oncurve.model.sources import load_model, load_tokenizer

    model = load_model(Path(base_dir))
    load_weights(model, checkpoint / "model.safetensors")
    save_final(model, load_tokenizer(Path(base_dir)), out, model.generation_config)
    return out


def equal_time_step(fast: dict, slow: dict, save_every: int, steps: int) -> tuple[float, int]:
    """(budget in seconds, the slower run's newest saved step that fits in it; 0 if none)."""
    budget = sum(fast["seconds"])
    elapsed, best = 0.0, 0
    for step, seconds in enumerate(slow["seconds"], start=1):
        elapsed += seconds
        if elapsed > budget:
            break
        if step % save_every == 0 or step == steps:
            best = step
    return budget, best


def score_equal_time(job: Job, pair: dict[str, dict], test_file: Path, work: Path, start: float):
    """Held-out accuracy of both trainers at the faster one's training time (see module doc)."""
    steps, tokens = job.settings["run.steps"], job.settings["rollout.max_new_tokens"]
    total = {t: sum(pair[t]["seconds"]) for t in TRAINERS}
    fast, slow = sorted(TRAINERS, key=total.get)
    budget, step = equal_time_step(pair[fast], pair[slow], job.settings["run.save_every"], steps)
    if step == steps:
        accuracy = pair[slow]["accuracy"]
    elif step == 0:
        accuracy = start
    else:
        checkpoint = Path(pair[slow]["run_dir"]) / "checkpoints" / f"step-{step:06d}"
        base = job.settings["model.path"]
        directory = checkpoint_model(base, checkpoint, work / f"{slow}-step{step}")
        accuracy = greedy_accuracy(str(directory), test_file, tokens)
    pair[fast]["equal_time"] = {"step": steps, "accuracy": pair[fast]["accuracy"]}
    pair[slow]["equal_time"] = {"step": step, "accuracy": accuracy}
    for trainer in TRAINERS:
        pair[trainer]["equal_time"]["budget"] = budget


def runtime_floor(model_dir: str) -> float:
    """Peak RSS in MB of a process that imports torch, transformers and oncurve's trainer and
    builds `model_dir`'s model class on the meta device (no weights): the fixed cost inside
    every run's peak. The model class matters: transformers' model code and loading machinery
    import ~1,100 more modules (torch.distributed.tensor, sympy, dynamo), 87 MB at 30M."""
    code = (
        "import torch, transformers, oncurve.loop.trainer\n"
        "from harness.children import own_peak_rss\n"
        f"config = transformers.AutoConfig.from_pretrained({model_dir!r})\n"
        "with torch.device('meta'):\n"
        "    transformers.AutoModelForCausalLM.from_config(config)\n"
        "print(own_peak_rss())\n"
    )
    # The first import in a fresh tree also compiles every module to bytecode, a peak no
    # training run pays; the second process measures a warm import.
    for _ in range(2):
        command = [sys.executable, "-c", code]
        out = subprocess.run(command, capture_output=True, text=True, env=checkout_env())
        if out.returncode:
            raise SystemExit(f"importing oncurve failed:\n{out.stderr[-2000:]}")
    value = out.stdout.strip().splitlines()[-1]
    return float(value) if value != "None" else 0.0  # no /proc: the breakdown shows no runtime


def benchmark(args: argparse.Namespace) -> dict:
    """GRPO and PPO alternately, `args.runs` pairs; the row's figures."""
    import torch
    import transformers

    job = make_job(args.model, args)
    path, tokens = job.settings["model.path"], job.settings["rollout.max_new_tokens"]
    key = section_key(args)
    work = WORK / "runs" / key
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    test_file = (
        export_task("arith", "test", args.eval_n, work / "test.jsonl") if args.eval_n else None
    )
    config = transformers.AutoConfig.from_pretrained(path)
    with torch.device("meta"):  # parameters counted without allocating them
        params = transformers.AutoModelForCausalLM.from_config(config).num_parameters()
    load_before = load_note()
    # the breakdown of a peak RSS into the runtime and the states is the CPU's question
    floor = runtime_floor(path) if args.device == "cpu" else None
    start = greedy_accuracy(path, test_file, tokens) if test_file else None
    print(f"[{key}] runtime floor {cell(floor, '.0f')} MB; starting accuracy "
          f"{cell(start, '.1%')}", flush=True)  # fmt: skip
    pairs: list[dict[str, dict]] = []
    for index in range(args.runs):
        pair: dict[str, dict] = {}
        for trainer in TRAINERS:
            out = work / f"{trainer}-{index}"
            out.mkdir()
            print(f"[{key}] run {index + 1}/{args.runs}: {trainer} ...", flush=True)
            own = job.with_settings(algo__preset=trainer.lower(), run__seed=index)
            result = run(own, out)
            final = str(Path(result["run_dir"]) / "final")
            result["accuracy"] = greedy_accuracy(final, test_file, tokens) if start else None
            median = statistics.median(result["seconds"][1:] or result["seconds"])
            print(f"  {median:.2f} s/step, peak RSS {result['rss']:.0f} MB, peak CUDA "
                  f"{cell(result['cuda'], ',.0f')} MB (plan {cell(result['plan_gb'], '.1f')} "
                  f"GiB), final reward {result['reward'][-1]:.3f}, accuracy "
                  f"{cell(result['accuracy'], '.1%')}", flush=True)  # fmt: skip
            pair[trainer] = result
            if args.json:  # after each run: a caller's time limit may stop the next one
                Path(args.json).write_text(json.dumps({"pairs": [*pairs, pair]}))
        if start is not None:
            score_equal_time(job, pair, test_file, work, start)
        pairs.append(pair)
    if args.json:  # again: equal-time scores were added to the pairs
        Path(args.json).write_text(json.dumps({"pairs": pairs}))
    cpu = f"{cpu_name()}, {os.cpu_count()} cores, torch threads {torch_threads()}"
    return {
        "model": args.model,
        "settings": job.settings | {"algo.preset": "grpo | ppo", "run.seed": "0..runs-1"},
        "runs_per_trainer": args.runs,
        "eval_n": args.eval_n,
        "params": params,
        "floor": floor,
        "start": start,
        "load_note": f"{load_before} before, {load_note()} after",
        "cpu": f"{torch.cuda.get_device_name()} ({cpu})" if args.device == "cuda" else cpu,
        "pairs": pairs,
    }


def section_key(args: argparse.Namespace) -> str:
    """The results section of a run: model, checkpointing, device."""
    key = args.model + ("-gc" if args.gradient_checkpointing else "")
    return key + ("-cuda" if args.device == "cuda" else "")


def summary(runs: list[dict], scored: bool) -> dict:
    """One trainer's figures over its runs: median s/step after each run's first, the peaks,
    mean reward, and the accuracies (None unscored)."""

    def mean(key: str, inner: str | None = None) -> float | None:
        if not scored:
            return None
        return statistics.mean(r[key][inner] if inner else r[key] for r in runs)

    return {
        "seconds": statistics.median(s for r in runs for s in r["seconds"][1:] or r["seconds"]),
        "rss": max(r["rss"] for r in runs),
        "cuda": max((r["cuda"] for r in runs if r["cuda"] is not None), default=None),
        "plan_gb": max((r["plan_gb"] for r in runs if r.get("plan_gb") is not None), default=None),
        "reward": statistics.mean(x for r in runs for x in r["reward"]),
        "accuracy": mean("accuracy"),
        "equal_step": mean("equal_time", "step"),
        "equal_acc": mean("equal_time", "accuracy"),
    }


def section(row: dict) -> str:
    """The markdown section of one row; accuracies are "n/a" when none were scored (`--eval-n
    0`)."""
    s, pairs, start = row["settings"], row["pairs"], row["start"]
    scored, steps, key = start is not None, s["run.steps"], row["key"]
    stats = {t: summary([pair[t] for pair in pairs], scored) for t in TRAINERS}
    base, cuda = stats["PPO"], stats["PPO"]["cuda"] is not None
    header = ["trainer", "peak RSS MB", "vs PPO"]
    header += ["peak CUDA MB", "vs PPO", "memory plan's peak GiB"] if cuda else []
    header += ["median s/step", "vs PPO", "mean reward, all steps",
               f"greedy acc. after {steps} steps", "step at equal time", "greedy acc. at equal time"]  # fmt: skip
    rows = []
    for trainer, t in stats.items():
        line = [trainer, f"{t['rss']:,.0f}", f"{t['rss'] / base['rss']:.2f}x"]
        if cuda:
            line += [
                f"{t['cuda']:,.0f}",
                f"{t['cuda'] / base['cuda']:.2f}x",
                cell(t["plan_gb"], ".1f"),
            ]
        line += [f"{t['seconds']:.3f}", f"{t['seconds'] / base['seconds']:.2f}x",
                 f"{t['reward']:.3f}", cell(t["accuracy"], ".1%"), cell(t["equal_step"], "g"),
                 cell(t["equal_acc"], ".1%")]  # fmt: skip
        rows.append(line)
    memory = stats["GRPO"]["rss"] / base["rss"]
    if cuda:
        verdict = (
            f"Peak GPU memory (`torch.cuda.max_memory_allocated`): GRPO "
            f"**{stats['GRPO']['cuda'] / base['cuda']:.3f}x** PPO's (the claim: 25-50% less, "
            f"0.50-0.75x); peak RSS {memory:.3f}x."
        )
    else:
        target = (f"target <= {TARGET}x: **{'met' if memory <= TARGET else 'missed'}**"
                  if key.startswith("30m") else f"reported only (the {TARGET}x target is for the "
                  "~30M model)")  # fmt: skip
        verdict = (f"Peak memory (process peak RSS, runtime included): GRPO **{memory:.3f}x** "
                   f"PPO's; {target}.")  # fmt: skip
    equal_time = ""
    if scored:
        p = max(min((stats["GRPO"]["accuracy"] + base["accuracy"]) / 2, 1.0), 0.0)
        n = row["eval_n"]
        verdict += (
            f" Held-out greedy accuracy ({n} prompts, starting model {start:.1%}; two binomial "
            f"standard errors {2 * (p * (1 - p) / n) ** 0.5:.1%})."
        )
        if start == 0 and all(t["accuracy"] == 0 for t in stats.values()):
            verdict += (" Random weights: accuracy is 0 for both after so few steps; the "
                        "accuracy comparison is the bundled default's.")  # fmt: skip
        budget = statistics.mean(pair["GRPO"]["equal_time"]["budget"] for pair in pairs)
        equal_time = (
            f"Equal wall-clock time: the budget is the faster trainer's training time for "
            f"{steps} steps (sum of `time/step`, mean {budget:.0f} s); the slower trainer is "
            f"scored at its newest checkpoint (saved every {s['run.save_every']} steps) whose "
            "cumulative `time/step` fits in it (step 0 = the starting model).\n\n"
        )
    breakdown = ""
    if row["floor"] is not None:
        breakdown = (
            "Where the peak comes from (MB; states computed from parameter counts, runtime "
            "measured as the peak RSS of a process that imports torch, transformers and oncurve "
            "and builds the model class without weights; the rest is activations, logits, the "
            "rollout's cache and allocator slack):\n\n"
            + memory_breakdown(s["algo.beta"], row["params"], row["floor"], stats)
            + "\n\n"
        )
    phase_rows = []
    for trainer in TRAINERS:
        for phase, first in pairs[0][trainer]["phases"].items():
            values = [x for pair in pairs for x in pair[trainer]["phases"][phase][1:]]
            median = statistics.median(values or first)
            phase_rows.append([trainer, phase, f"{median:.3f}",
                               f"{median / stats[trainer]['seconds']:.0%}"])  # fmt: skip
    per_run = [
        [trainer, str(i + 1),
         " ".join(f"{x:.2f}" for x in r["seconds"]) if len(r["seconds"]) <= 10 else "...",
         f"{sum(r['seconds']):.0f}", f"{r['rss']:,.0f}", f"{r['wall']:.0f}",
         cell(r["accuracy"], ".1%"),
         f"{r['equal_time']['step']} / {r['equal_time']['accuracy']:.1%}" if scored else "n/a"]
        for i, pair in enumerate(pairs) for trainer in TRAINERS for r in [pair[trainer]]
    ]  # fmt: skip
    forced = ", forced to full length" if s["rollout.min_new_tokens"] else ""
    device = s["run.device"]
    precision = "fp32" if device == "cpu" else "model.dtype auto (bf16 on the GPU)"
    return (
        f"### {key}: {row['params'] / 1e6:.2f}M params, {s['data.prompts_per_step']} prompts x "
        f"G={s['rollout.group_size']}, {s['rollout.max_new_tokens']} tokens{forced}, {steps} "
        f"steps x {row['runs_per_trainer']} runs per trainer\n\n"
        f"Measured {row['date']} at {row['commit']} on {row['cpu']}; `{row['command']}`; lr "
        f"{s['optim.lr']} (both; PPO's critic too), beta {s['algo.beta']} (GRPO: k3 in the loss; "
        f"PPO: k1 in the reward), epsilon {s['algo.epsilon']}, mu {s['algo.mu']}, microbatch "
        f"{s['optim.microbatch_size']} rows, gradient checkpointing "
        f"{'on' if s['model.gradient_checkpointing'] else 'off'}, {precision}; "
        f"{row['load_note']}.\n\n"
        + markdown_table(header, rows)
        + f"\n\n{verdict}\n\n{equal_time}{breakdown}"
        + "Median seconds per phase (steps after the first; PPO's `train` includes the "
        "critic's value forward and its update):\n\n"
        + markdown_table(["trainer", "phase", "median s", "share of step"], phase_rows)
        + "\n\nPer run (steps in order; wall includes start-up, saving and logging):\n\n"
        + markdown_table(
            [
                "trainer",
                "run",
                "s per step",
                "train s",
                "peak RSS MB",
                "wall s",
                "acc.",
                "equal time: step / acc.",
            ],
            per_run,
        )  # fmt: skip
        + "\n"
    )


def memory_breakdown(beta: float, params: int, floor: float, stats: dict) -> str:
    """The peaks split into the runtime's fixed cost, the models' states and the rest, plus the
    ratio the two trainers would have with no activations at all (the best case for GRPO)."""
    size = params * 4 / 2**20  # MB of one fp32 copy; the critic (trunk + scalar head, tied
    # embeddings) has the policy's count to within its head
    reference = size if beta > 0 else 0.0
    # Gradients are freed after each optimizer step, so one model's gradients exist at a time.
    states = {
        "GRPO": {"policy": 3 * size, "reference": reference, "critic": 0.0, "gradients": size},
        "PPO": {"policy": 3 * size, "reference": reference, "critic": 3 * size, "gradients": size},
    }
    header = ["trainer", "peak RSS", "runtime", "policy + AdamW", "reference", "critic + AdamW"]
    header += ["gradients", "rest"]
    rows = []
    for trainer in TRAINERS:
        parts = states[trainer]
        rest = stats[trainer]["rss"] - floor - sum(parts.values())
        values = [stats[trainer]["rss"], floor, *parts.values(), rest]
        rows.append([trainer] + [f"{x:,.0f}" for x in values])
    best = (floor + sum(states["GRPO"].values())) / (floor + sum(states["PPO"].values()))
    return markdown_table(header, rows) + (
        "\n\nWith no activations in either trainer the ratio would be (runtime + GRPO's states) / "
        f"(runtime + PPO's states) = **{best:.3f}x**; the measured ratio differs from it by the two "
        "rests (PPO's holds the critic's own forward and backward and the allocator slack around "
        "them)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="default", help="default | tiny | 30m | qwen2.5-0.5b | PATH"
    )
    parser.add_argument("--steps", type=int, help="steps per run (default: per model)")
    parser.add_argument("--runs", type=int, default=1, help="runs per trainer, alternating")
    parser.add_argument("--prompts", type=int, help="prompts per step (default: per model)")
    parser.add_argument("--group", type=int, help="G (default: per model)")
    parser.add_argument("--tokens", type=int, help="completion tokens (default: per model)")
    parser.add_argument("--save-every", type=int, help="checkpoint interval (default: per model)")
    parser.add_argument("--lr", type=float, default=1e-4, help="both policies and the critic")
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--epsilon", type=float, default=0.2)
    parser.add_argument("--mu", type=int, default=1)
    parser.add_argument("--microbatch", type=int, default=64, help="rows per forward/backward")
    parser.add_argument(
        "--eval-n", type=int, default=200, help="held-out prompts scored; 0 scores no accuracy"
    )
    parser.add_argument("--gradient-checkpointing", action="store_true", help="on in both")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="run.device")
    parser.add_argument(
        "--force-length", action="store_true", help="every completion --tokens long (EOS held)"
    )
    parser.add_argument("--json", help="also write each run's peaks and seconds to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # train one run into this dir
    args = parser.parse_args()
    if args.child:
        child(Path(args.child))
        return
    if args.device == "cuda" and args.eval_n:
        print("note: accuracy is scored by `oncurve eval` on the CPU (--eval-n 0 skips it)")
    row = {"renderer": "grpo_vs_ppo", **benchmark(args)}
    publish("grpo_vs_ppo", TITLE, section_key(args), row)


if __name__ == "__main__":
    main()
