"""oncurve against TRL's GRPOTrainer on the CPU, the same GRPO job (`harness.spec.Job`): seconds
per step and per phase, peak RSS, reward, and held-out accuracy after the same steps, each
against the step's FLOP floor. The trainers alternate (oncurve, TRL, ...), each run a fresh
process; seconds per step are the median over every run's steps after its first.

    .venv/bin/python benchmarks/vs_trl.py --model default --steps 20 --runs 4
    .venv/bin/python benchmarks/vs_trl.py --model 30m --steps 3 --runs 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import comparison
from harness.checkout import CACHE
from harness.children import greedy_accuracy
from harness.machine import cpu_name, load_note, matmul_gflops, torch_threads
from harness.models import model_dir
from harness.spec import Job
from harness.tables import page_title, publish
from harness.trl_env import ensure_trl_venv, run_trl, trl_env, trl_versions

TITLE = page_title("oncurve vs TRL's GRPOTrainer", "vs_trl", "model")
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
    """The job of `args.model`'s scenario, with what the command line sets; on the CPU, also on
    a machine with a GPU."""
    scenario = SCENARIOS.get(args.model, SCENARIOS["default"])
    micro = args.microbatch or scenario[5]
    more = {"optim.warmup_steps": 0, "optim.microbatch_size": micro, "run.device": "cpu"}
    return comparison.arith_job(args, model_dir(args.model), scenario[:5], more)


def measure(args: argparse.Namespace) -> dict:
    """Both trainers' runs of the job, alternating; the row's figures."""
    import transformers

    from oncurve.model.kv_cache import microbatch_tokens
    from oncurve.model.sources import load_tokenizer

    job = make_job(args)
    config = job.config()
    python = ensure_trl_venv()
    env = trl_env(python)
    work, test = comparison.fresh(CACHE / "vs_trl" / args.model, args.eval_n)
    shape = transformers.AutoConfig.from_pretrained(config.model.path)
    model = transformers.AutoModelForCausalLM.from_config(shape)
    tokenizer = load_tokenizer(config.model.path)
    group, tokens = config.rollout.group_size, config.rollout.max_new_tokens
    rows = config.data.prompts_per_step * group
    shapes = [(2048, 1024, 1024), (min(rows * (tokens + 12), 8192), shape.hidden_size,
              shape.intermediate_size)]  # fmt: skip
    rate = max(matmul_gflops(*s) for s in shapes)
    load = load_note()

    def run(label: str, index: int) -> dict:
        seeded, out = job.with_settings(run__seed=index), work / f"{label}-{index}"
        if label == "oncurve":
            done = comparison.oncurve_run(seeded, out)
        else:
            done = run_trl(seeded, out, python, env, save=True)
        done["accuracy"] = greedy_accuracy(done["final"], test, tokens) if test else None
        prompt_ids = sum(len(r["prompt_ids"]) for r in seeded.step_rows(tokenizer))
        done["prompt_tokens"] = prompt_ids * group / config.run.steps
        return comparison.printed({k: done[k] for k in KEPT})

    runs = comparison.alternate(("oncurve", "TRL"), args.runs, run)
    params, gflops = model.num_parameters(), max(rate, *(matmul_gflops(*s) for s in shapes))
    return comparison.measured_row(
        args, job, params, load, runs,
        lambda done: comparison.floor_figures(done, job.settings, params, gflops),
        target=TARGETS.get(args.model, 0.8), matmul_gflops=gflops, matmul_shapes=shapes,
        token_cap=microbatch_tokens(model, None), trl_versions=trl_versions(python, env),
        cpu=f"{cpu_name()}, torch threads {torch_threads()}")  # fmt: skip


def section(row: dict) -> str:
    """The markdown section of one row: the trainers' figures, targets, phases and runs."""
    s, n, trainers = row["settings"], row["eval_n"], row["trainers"]
    base, ours = trainers["TRL"], trainers["oncurve"]
    columns = [
        ("median s/step", "s", ".3f"),
        ("vs TRL", "s", "x"),
        ("peak RSS MB", "rss", ",.0f"),
        ("vs TRL", "rss", "x"),
        ("mean length", "length", ".1f"),
        ("FLOP floor s", "floor", ".3f"),
        ("x floor", lambda t: f"{t['s'] / t['floor']:.1f}x", "s"),
        (f"reward at step {s['run.steps']}", "last", ".3f"),
        ("reward, all steps", "reward", ".3f"),
        (f"greedy acc. ({n} held out)", "acc", ".1%"),
    ]
    speed, memory = ours["s"] / base["s"], ours["rss"] / base["rss"]
    accuracy = "not scored"
    if n:
        noise = comparison.two_errors((ours["acc"] + base["acc"]) / 2, n)
        accuracy = (
            f"{ours['acc']:.1%} vs {base['acc']:.1%} (two binomial standard errors: {noise:.1%})"
        )
    cap = f" (oncurve also caps {row['token_cap']:,} tokens)" if row.get("token_cap") else ""
    details = (
        f"TRL's venv: {row['trl_versions']}; oncurve's: transformers "
        f"{row['versions'].get('transformers', 'not recorded')}; {comparison.grpo_settings(s)}, "
        f"fp32, {s['optim.microbatch_size']} rows per forward/backward{cap}, FLOP floor at "
        f"{row['matmul_gflops']:.1f} GFLOP/s (fp32 matmul, the best of "
        f"{', '.join('x'.join(map(str, shape)) for shape in row['matmul_shapes'])})"
    )
    verdict = (
        f"Targets: oncurve s/step <= {row['target']}x TRL's: **{speed:.2f}x, "
        f"{comparison.met(speed, row['target'])}**; peak RSS <= TRL's: **{memory:.2f}x, "
        f"{comparison.met(memory, 1)}**; held-out accuracy {accuracy}."
    )
    unmatched = (
        "Not matched: each trainer's sampling RNG; TRL's group std is unbiased (N-1, eps 1e-4), "
        "oncurve's the population std (eps 1e-6); oncurve's CPU token cap."
    )
    phases = ", and each phase over its own FLOP floor" if ours.get("x_floor") else ""
    return comparison.section(row, details, columns, [verdict, unmatched], phases)


def summary(row: dict) -> str:
    """The row in one line: s/step and peak RSS against TRL's, held-out accuracy if scored."""
    ours, base = row["trainers"]["oncurve"], row["trainers"]["TRL"]
    line = (f"{row['model']}: s/step {ours['s'] / base['s']:.2f}x TRL ({ours['s']:.2f} vs "
            f"{base['s']:.2f} s, matmul {row['matmul_gflops']:.0f} GFLOP/s); peak RSS "
            f"{ours['rss'] / base['rss']:.2f}x")  # fmt: skip
    return line + (f"; accuracy {ours['acc']:.1%} vs {base['acc']:.1%}" if row["eval_n"] else "")


def main() -> None:
    args = comparison.parser(__doc__, "default | tiny | 30m", runs=2, microbatch=None).parse_args()
    key = args.model if args.model in SCENARIOS else Path(args.model).name
    publish("vs_trl", TITLE, key, {"renderer": "vs_trl", **measure(args)})


if __name__ == "__main__":
    main()
