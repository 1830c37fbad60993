"""GRPO against PPO with a critic, both oncurve (`algo.preset=grpo` and `=ppo`), alternating
fresh `oncurve train` processes on one job (`harness.comparison.arith_job`): peak memory and its
parts, seconds per step, held-out greedy accuracy after the same steps and at equal training
time (`harness.equal_time`); what is held equal and how it measures: benchmarks/README.md.

    .venv/bin/python benchmarks/grpo_vs_ppo.py --model 30m     # ~30M params, 8 x 8, 128 tokens
    .venv/bin/python benchmarks/grpo_vs_ppo.py                 # the bundled default, 100 steps
    python3 benchmarks/grpo_vs_ppo.py --model qwen2.5-0.5b --device cuda --eval-n 0

`--device cuda` adds the peak GPU memory and the memory plan's; `qwen2.5-0.5b` is
`gpu_vs_trl.py`'s random 0.5B shape in bf16; `--json PATH` writes the runs (`gpu_check.py`).
"""

from __future__ import annotations

import argparse
import os

from harness import comparison, equal_time
from harness.checkout import CACHE
from harness.children import greedy_accuracy
from harness.machine import cpu_name, gpu_name, load_note, torch_threads
from harness.memory_parts import parameter_count, peak_notes, runtime_floor
from harness.models import SHAPES, build_model, model_dir, tokenizer_dir
from harness.spec import Job
from harness.tables import cell, page_title, publish

TITLE = page_title("GRPO vs PPO with a critic", "grpo_vs_ppo", "model and setting")
TRAINERS = ("GRPO", "PPO")
# model -> (prompts per step, G, completion tokens, force full length, steps, save every)
SCENARIOS = {
    "default": (16, 8, 64, False, 100, 5),
    "tiny": (16, 8, 64, False, 8, 2),
    "30m": (8, 8, 128, True, 3, 1),
    "qwen2.5-0.5b": (8, 8, 256, True, 2, 2),  # gpu_vs_trl.py's job size, on a GPU
}
TARGET = 0.70  # GRPO peak memory <= TARGET x PPO's (issue 7, on the ~30M model)
# the run table's columns beyond the harness's
RUN_COLUMNS = {
    "train s": lambda run: f"{run['train_s']:.0f}",
    "equal time: step / acc.": equal_time.equal_time_cell,
}


def make_job(name: str, args: argparse.Namespace) -> Job:
    """GRPO's job of model `name`'s scenario with what the command line sets; PPO's differs only
    in `algo.preset`."""
    prompts, group, tokens, force, steps, save_every = SCENARIOS.get(name, SCENARIOS["default"])
    scenario = (prompts, group, tokens, force or args.force_length, steps)
    # gpu_vs_trl's shapes carry the Qwen3 tokenizer; the others are vs_trl's
    path = build_model(name, tokenizer_dir(None)) if name in SHAPES else model_dir(name)
    steps, save_every = args.steps or steps, args.save_every or save_every
    more = {"rollout.temperature": 1.0, "optim.schedule": "constant",
            "optim.microbatch_size": args.microbatch, "run.save_every": save_every,
            "run.keep_last": steps // save_every + 1, "run.device": args.device}  # fmt: skip
    return comparison.arith_job(args, path, scenario, more)


def benchmark(args: argparse.Namespace, key: str) -> dict:
    """GRPO and PPO alternately, `args.runs` pairs, their runs under section `key`; the row's
    figures."""
    job = make_job(args.model, args)
    path, tokens = job.settings["model.path"], job.settings["rollout.max_new_tokens"]
    work, test = comparison.fresh(CACHE / "grpo_vs_ppo" / "runs" / key, args.eval_n)
    params, load = parameter_count(path), load_note()
    # the breakdown of a peak RSS into the runtime and the states is the CPU's question
    floor = runtime_floor(path) if args.device == "cpu" else None
    start = greedy_accuracy(path, test, tokens) if test else None
    print(f"[{key}] runtime floor {cell(floor, '.0f')} MB; starting accuracy {cell(start, '.1%')}")

    def run(trainer: str, index: int) -> dict:
        own = job.with_settings(algo__preset=trainer.lower(), run__seed=index)
        done = comparison.oncurve_run(own, work / f"{trainer}-{index}")
        done["accuracy"] = greedy_accuracy(done["final"], test, tokens) if test else None
        return comparison.printed(done | {"train_s": sum(done["seconds"])})

    write_json = comparison.pairs_writer(args.json)
    runs = comparison.alternate(TRAINERS, args.runs, run, write_json)
    if test:
        equal_time.score_equal_time(runs, job.settings["run.save_every"], tokens, test, start)
        write_json(runs)  # again, with the equal-time scores
    cpu = f"{cpu_name()}, {os.cpu_count()} cores, torch threads {torch_threads()}"
    cpu = f"{gpu_name()} ({cpu})" if args.device == "cuda" else cpu
    return comparison.measured_row(
        args, job.with_settings(algo__preset="grpo | ppo"), params, load, runs,
        equal_time.summary, floor=floor, start=start, cpu=cpu)  # fmt: skip


def section(row: dict) -> str:
    """The markdown section of one row; accuracies are "n/a" when none were scored (`--eval-n
    0`)."""
    s, ppo = row["settings"], row["trainers"]["PPO"]
    columns = [("peak RSS MB", "rss", ",.0f"), ("vs PPO", "rss", "x")]
    columns += [("peak CUDA MB", "cuda", ",.0f"), ("vs PPO", "cuda", "x"),
                ("memory plan's peak GiB", "plan_gb", ".1f")] if ppo["cuda"] else []  # fmt: skip
    columns += [("median s/step", "s", ".3f"), ("vs PPO", "s", "x"),
                ("mean reward, all steps", "reward", ".3f"),
                (f"greedy acc. after {s['run.steps']} steps", "acc", ".1%")]  # fmt: skip
    verdict, where = peak_notes(row, TARGET, row["key"].startswith("30m"))
    sentence, equal = equal_time.accuracy_notes(row) if row["start"] is not None else ("", None)
    parts = [part for part in (verdict + sentence, equal, where) if part]
    precision = "fp32" if s["run.device"] == "cpu" else "model.dtype auto (bf16 on the GPU)"
    notes = {"lr": "both; PPO's critic too", "beta": "GRPO: k3 in the loss; PPO: k1 in the reward"}
    details = f"{comparison.grpo_settings(s, notes)}, microbatch {s['optim.microbatch_size']} rows"
    phases = "; PPO's `train` includes the critic's value forward and its update"
    columns += equal_time.COLUMNS
    return comparison.section(
        row, f"{details}, {precision}", columns, parts, phases, 10, RUN_COLUMNS
    )


def summary(row: dict) -> str:
    """The comparison in one line: GRPO's peak RSS (CUDA peak on a GPU) and s/step as
    fractions of PPO's."""
    grpo, ppo = row["trainers"]["GRPO"], row["trainers"]["PPO"]
    peak, memory = ("cuda", "peak GPU memory") if grpo.get("cuda") else ("rss", "peak RSS")
    line = f"GRPO {memory} {grpo[peak] / ppo[peak]:.3f}x PPO's, s/step {grpo['s'] / ppo['s']:.2f}x"
    scored = grpo.get("acc") is not None
    return line + (f"; held-out {grpo['acc']:.1%} vs {ppo['acc']:.1%}" if scored else "")


def headline(row: dict) -> dict | None:
    """The README's memory row, from the 30M model with checkpointing on the CPU."""
    if row["key"] != "30m-gc":
        return None
    grpo, ppo = row["trainers"]["GRPO"], row["trainers"]["PPO"]
    figure = f"GRPO's peak RSS {grpo['rss'] / ppo['rss']:.2f}x PPO's (30M model, CPU)"
    area, command = "memory against PPO with a critic", "benchmarks/grpo_vs_ppo.py"
    return {"area": area, "figure": figure, "command": command}


def main() -> None:
    p = comparison.parser(__doc__, "default | tiny | 30m | qwen2.5-0.5b", runs=1, microbatch=64)
    p.add_argument("--save-every", type=int, help="checkpoint interval (default: per model)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="run.device")
    p.add_argument("--force-length", action="store_true", help="every completion --tokens long")
    p.add_argument("--json", help="also write each run's figures to this file (gpu_check.py)")
    args = p.parse_args()
    if args.device == "cuda" and args.eval_n:
        print("note: accuracy is scored by `oncurve eval` on the CPU (--eval-n 0 skips it)")
    key = args.model + ("-gc" if args.gradient_checkpointing else "")
    key += "-cuda" if args.device == "cuda" else ""
    publish("grpo_vs_ppo", TITLE, key, {"renderer": "grpo_vs_ppo", **benchmark(args, key)})


if __name__ == "__main__":
    main()
