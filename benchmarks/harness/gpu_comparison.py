"""oncurve against TRL on one GPU (`gpu_vs_trl.py`): prompts and model, a trainer's run in a
fresh process, its figures over its runs, a row's section and `gpu_check.py`'s rows of it."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from harness import run_logs
from harness.checkout import BENCHMARKS, CACHE, checkout_env
from harness.children import GpuMemoryPeak, train_oncurve
from harness.comparison import steady_median
from harness.gpu_bundle import TRL_MISSING
from harness.gpu_stages import FAILED, against, compile_capture, gib, phase_peaks, plan_against
from harness.models import build_model, tokenizer_dir
from harness.spec import Job, chat_text
from harness.tables import cell, markdown_table
from harness.trl_env import run_trl, trl_env

PHASES = ("generate", "reward", "reference", "train")
WORD_PROBLEMS = BENCHMARKS / "data" / "word_problems.json"
WORK = CACHE / "gpu_vs_trl"
PROMPTS_FILE = WORK / "prompts.jsonl"
# what a row keeps of each run (the phases and lengths of each step are in its summary)
KEPT = ("status", "ok", "seconds", "gpu_peak_gb", "smi_peak_gb", "wall")


def word_problems(count: int) -> list[dict[str, str]]:
    """`count` addition word problems ("prompt", "answer") on the arith task's train rows, so
    that its `correct` reward scores them (`WORD_PROBLEMS`; deterministic)."""
    from oncurve.data.tasks import get_task

    words = json.loads(WORD_PROBLEMS.read_text())
    names, stock = words["names"], words["stock"]
    rows = []
    for i, row in enumerate(get_task("arith").examples("train", count, seed=0)):
        a, b = (int(x) for x in row["prompt"].rstrip("=").split("+"))
        place, item = stock[i % len(stock)]
        name = names[i // len(stock) % len(names)]
        text = words["template"].format(name=name, place=place, item=item, a=a, b=b)
        rows.append({"prompt": text, "answer": row["answer"]})
    return rows


def prepare(
    model: str, tokenizer_source: str | None, prompts: Path, eos_mean_length: float | None = None
) -> Path:
    """The Qwen3 tokenizer in the cache, 512 word problems in the JSONL `prompts` (their mean
    length with the chat template printed) and the model `model` (`build_model`); its directory."""
    import transformers

    tokenizer_path = tokenizer_dir(tokenizer_source)
    rows = word_problems(512)
    prompts.parent.mkdir(parents=True, exist_ok=True)
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path)
    lengths = [len(tokenizer(text=chat_text(tokenizer, r["prompt"]))["input_ids"]) for r in rows]
    print(f"{len(rows)} prompts in {prompts}, {statistics.mean(lengths):.1f} tokens on average "
          f"with the chat template ({min(lengths)}-{max(lengths)})", flush=True)  # fmt: skip
    return build_model(model, tokenizer_path, eos_mean_length)


def oncurve_figures(rows: list[dict], log: str) -> dict[str, Any]:
    """What a finished oncurve run logged: per-step seconds and phases, peak GPU memory
    (measured and planned, by phase), lengths, the sampler's compile and capture seconds."""
    phases = run_logs.step_phases(rows)
    phases["generate"] = phases.pop("rollout")
    peaks = [r["memory/gpu_peak_gb"] for r in rows if r.get("memory/gpu_peak_gb") is not None]
    return {
        "seconds": [r["time/step"] for r in rows],
        "phases": {p: phases[p] for p in PHASES if p in phases},
        "gpu_peak_gb": max(peaks, default=None),
        "phase_peaks_gb": run_logs.measured_phase_peaks_gb(rows),
        "plan_gb": run_logs.planned_peak_gb(log),
        "plan_phases_gb": run_logs.planned_phase_peaks_gb(log),
        "length": [r["length/mean"] for r in rows],
        "compile_capture_s": run_logs.sampler_setup_seconds(rows[-1]),
    }


def environments(trl_python: str, trl_required: bool) -> dict[str, dict[str, str]]:
    """Each trainer's child environment: oncurve's, and TRL's where `trl_python` imports trl
    (`trl_env`); without it, an error when `trl_required`, else a note and oncurve alone."""
    envs = {"oncurve": checkout_env(TOKENIZERS_PARALLELISM="false")}
    if (trl := trl_env(trl_python)) is not None:
        envs["TRL"] = trl
    elif trl_required:
        raise SystemExit(f"{trl_python}: {TRL_MISSING}")
    else:
        print(f"note: {trl_python} cannot import trl; oncurve only", flush=True)
    return envs


def run_trainer(label: str, job: Job, out: Path, python: str, env: dict[str, str]) -> dict:
    """One run of `label` (oncurve or TRL) in a fresh process: status, wall seconds, nvidia-smi's
    peak and, when it finished, its figures (seconds, phases, peak GPU memory, lengths)."""
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
    result = done | {"smi_peak_gb": smi.peak, "ok": not done["code"]}
    text = log.read_text(errors="replace")
    result["status"] = "finished" if result["ok"] else (
        "OOM" if "out of memory" in text.lower() else f"failed ({done['code']})")  # fmt: skip
    if not result["ok"]:
        print(f"  {label} {result['status']}; log: {log}\n{text[-1500:]}", flush=True)
    else:
        steady = steady_median([result["seconds"]])
        print(f"  {steady:.2f} s/step, peak GPU {result['gpu_peak_gb']} GiB (torch), "
              f"{result['smi_peak_gb']} GiB (nvidia-smi)", flush=True)  # fmt: skip
    return result


def summarize(runs: list[dict]) -> dict | None:
    """One trainer's figures over its finished runs (None if none finished): medians of the
    steps after each run's first, the largest peaks, mean length, and for oncurve its plan."""
    done = [r for r in runs if r["ok"]]
    if not done:
        return None

    def largest(key: str) -> float | None:
        return max((r[key] for r in done if r.get(key) is not None), default=None)

    def largest_by_phase(key: str) -> dict[str, float]:
        merged: dict[str, float] = {}
        for phases in (r.get(key) or {} for r in done):
            merged |= {p: max(merged.get(p, x), x) for p, x in phases.items()}
        return merged

    return {
        "seconds": steady_median(r["seconds"] for r in done),
        "phases": {p: steady_median(r["phases"][p] for r in done) for p in done[0]["phases"]},
        "length": statistics.mean(x for r in done for x in r["length"]),
        **{k: largest(k) for k in ("gpu_peak_gb", "smi_peak_gb", "plan_gb", "compile_capture_s")},
        **{k: largest_by_phase(k) for k in ("phase_peaks_gb", "plan_phases_gb")},
    }


def columns(summary: dict) -> dict[str, float | None]:
    """A trainer's summary as its row of the table: s/step, each phase's, the two peaks."""
    peaks = {k: summary[k] for k in ("gpu_peak_gb", "smi_peak_gb")}
    return {"seconds": summary["seconds"], **summary["phases"], **peaks}


def figures(runs: dict[str, list[dict]]) -> dict[str, Any]:
    """A row's figures from each trainer's runs: its summary, each run's `KEPT` figures, and
    when both trainers finished a run, oncurve's figures over TRL's."""
    stats, ratios = {label: summarize(done) for label, done in runs.items()}, {}
    if stats.get("oncurve") and stats.get("TRL"):
        ours, base = columns(stats["oncurve"]), columns(stats["TRL"])
        ratios = {
            k: ours[k] / base[k] if ours[k] is not None and base.get(k) else None for k in ours
        }
    kept = {
        label: [{k: r[k] for k in KEPT if k in r} for r in done] for label, done in runs.items()
    }
    return {"stats": stats, "ratios": ratios, "runs": kept}


def times(ratio: float | None) -> str:
    """A ratio as "1.23x", or "n/a" when it was not measured."""
    return cell(ratio) + ("x" if ratio is not None else "")


def summary(row: dict) -> str:
    """The row in one line: s/step and peak GPU memory against TRL's, where both ran."""
    ratios, tokens = row["ratios"], row["settings"]["rollout.max_new_tokens"]
    if not ratios:
        return f"{row['model']}, {tokens} tokens: not both trainers finished"
    return (f"{row['model']}, {tokens} tokens: s/step {times(ratios['seconds'])} TRL's (target "
            f"{row['speed_target']}x); peak GPU memory {times(ratios['gpu_peak_gb'])}")  # fmt: skip


def section(row: dict) -> str:
    """The markdown section of one row: the trainers and their quotient, targets, runs."""
    s, stats, ratios, results = row["settings"], row["stats"], row["ratios"], row["runs"]
    tokens, cap = s["rollout.max_new_tokens"], row["gpu_memory_gb"]
    keys = ("seconds", *PHASES, "gpu_peak_gb", "smi_peak_gb")
    table = []
    for label, runs in results.items():
        value = columns(stats[label]) if stats[label] else {}
        shown = [cell(value.get(k), ".3f" if i < 5 else ".2f") for i, k in enumerate(keys)]
        table.append([label, *shown, f"{sum(r['ok'] for r in runs)}/{len(runs)}"])
    if ratios:
        table.append(["oncurve / TRL", *(times(ratios.get(k)) for k in keys), ""])
    own_target = tokens == 256 or row.get("workload") == "long"
    scope = "" if own_target and not cap else " (target set at 256 tokens)"
    targets = []
    checks = [("peak GPU memory", "gpu_peak_gb", 1.0, "GiB"),
              ("s/step", "seconds", row["speed_target"], "s")]  # fmt: skip
    for name, k, limit, unit in checks if ratios else ():
        q = ratios[k]
        holds = "n/a" if q is None else f"{q:.2f}x, {'yes' if q <= limit else 'no'}"
        measured = f"{cell(stats['oncurve'][k])} vs {cell(stats['TRL'][k])} {unit}"
        targets.append([f"{name} <= {limit:g}x TRL's{scope}", measured, holds])
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
    forced = s.get("rollout.min_new_tokens", tokens) == tokens  # rows without it: forced
    ending = f"forced to {tokens}" if forced else f"ending at EOS, {tokens} at most"
    versions = "; ".join(f"{label}'s python: {v}" for label, v in row["python_versions"].items())
    at = f" at {row['commit']}" if row.get("commit") else ""
    header = ["trainer", "s/step", *(f"{p} s" for p in PHASES), "peak GPU GiB (torch)",
              "peak GPU GiB (nvidia-smi)", "runs finished"]  # fmt: skip
    return (
        f"### {row['model']}-{tokens}{f'-{cap:g}gib' if cap else ''}: "
        f"{s['data.prompts_per_step']} prompts x G={s['rollout.group_size']}, {tokens} tokens, "
        f"{s['run.steps']} steps x {row['runs_per_trainer']} runs per trainer\n\n"
        f"Measured {row['date']}{at} on {row['gpu']}; `{row['command']}`; {versions}. Medians "
        f"over the steps after each run's first; prompts {row['prompt_tokens']:.1f} tokens on "
        f"average, completions {ending} (mean length {lengths}); memory cap "
        f"{f'{cap:g} GiB' if cap else 'none'}. What is held equal and how each figure is "
        "measured: benchmarks/README.md, gpu_vs_trl.py.\n\n"
        f"{markdown_table(header, table)}\n\nTargets (issues 22, 34 and 39):\n\n"
        + markdown_table(["target", "measured", "holds"],
                         targets or [["none measurable", "needs a run of each trainer", "n/a"]])
        + "\n\nPer run (steps in order; wall includes start-up):\n\n"
        + markdown_table(["trainer", "run", "status", "s per step", "torch GiB",
                          "nvidia-smi GiB", "wall s"], per_run)
        + "\n"
    )  # fmt: skip


def trl_rows(figures: dict) -> list[list[str]]:
    """`gpu_check.py`'s rows of `gpu_vs_trl.py --json`: both trainers' figures against the
    targets, oncurve's memory plan against its peaks."""
    stats, target = figures["stats"], figures["speed_target"]
    if "TRL" not in stats:
        return [["TRL", "not run: the interpreter could not import it"]]
    ours, base = stats["oncurve"], stats["TRL"]  # None: that run failed
    if ours is None:
        return [["oncurve", FAILED]]
    rows = [
        ["memory plan: predicted / measured peak",
         plan_against(ours["plan_gb"], ours["gpu_peak_gb"])],
        ["oncurve peak by phase, measured / planned",
         phase_peaks(ours.get("phase_peaks_gb", {}), ours.get("plan_phases_gb", {}))],
        ["oncurve sampler's compile + capture", compile_capture(ours.get("compile_capture_s"))],
    ]  # fmt: skip
    if base is None:
        return [["TRL", FAILED], *rows]
    speed = ours["seconds"] / base["seconds"]
    memory = ours["gpu_peak_gb"] / base["gpu_peak_gb"]
    phases = ", ".join(
        f"{name} {ours['phases'][name]:.2f} / {seconds:.2f}"
        for name, seconds in base.get("phases", {}).items()
        if name in ours.get("phases", {}) and name != "reward"
    )
    return [
        ["s/step oncurve / TRL", f"{ours['seconds']:.2f} / {base['seconds']:.2f} s = "
         f"{speed:.2f}x {against(speed, target)}"],
        ["phases oncurve / TRL, s", phases or "n/a"],
        ["peak GPU memory oncurve / TRL", f"{gib(ours['gpu_peak_gb'])} / "
         f"{gib(base['gpu_peak_gb'])} = {memory:.2f}x {against(memory, 1)}"],
        ["mean completion length oncurve / TRL, tokens",
         f"{ours['length']:.1f} / {base['length']:.1f}"],
        *rows,
    ]  # fmt: skip


def job_parser(doc: str) -> argparse.ArgumentParser:
    """The options that make the job, of `gpu_vs_trl.py` and `profile_step.py`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    add = parser.add_argument
    add("--tokens", type=int, help="completion tokens (default 256; 16 --smoke)")
    add("--steps", type=int, help="steps per run (default 5; 3 over 256 tokens; 2 --smoke)")
    add("--gpu-memory-gb", type=float, help="GiB both trainers are capped at (run.gpu_memory_gb)")
    add("--tokenizer", help="Qwen3 tokenizer dir to copy into the cache")
    add("--smoke", action="store_true", help="2-layer model on the CPU, 16 tokens (development)")
    add("--long", action="store_true", help="the long-reasoning workload (gpu_vs_trl.py's doc)")
    return parser


def make_job(args: argparse.Namespace) -> tuple[str, Job]:
    """The model's name and the job both trainers run, its model prepared."""
    model = "smoke" if args.smoke else "qwen2.5-1.5b" if args.long else "qwen2.5-0.5b"
    tokens = args.tokens or (32 if args.smoke and args.long else 16 if args.smoke else
                             4096 if args.long else 256)  # fmt: skip
    eos_mean_length = tokens / 2 if args.long else None
    rewards = [{"name": f"{fn.__module__}:{fn.__qualname__}", "weight": w}
               for _, fn, w in Job({}).rewards()]  # fmt: skip
    path = prepare(model, args.tokenizer, PROMPTS_FILE, eos_mean_length)
    settings = {
        "run.device": "cpu" if args.smoke else "cuda", "run.seed": 0,
        "run.steps": args.steps or (2 if args.smoke or args.long else 5 if tokens <= 256 else 3),
        "model.path": str(path), "data.path": str(PROMPTS_FILE), "data.chat_template": True,
        "data.prompts_per_step": 16 if args.long else 8,
        "reward.functions": json.dumps(rewards), "rollout.group_size": 8,
        "rollout.max_new_tokens": tokens, "rollout.min_new_tokens": 0 if args.long else tokens,
        "rollout.temperature": 1.0, "algo.preset": "grpo", "algo.beta": 0.04, "algo.mu": 1,
        "optim.lr": 1e-6, "optim.warmup_steps": 0, "eval.at_start_end": False,
        "log.samples_per_step": 0,
    }  # fmt: skip
    # TRL's own default per_device_train_batch_size: 8 rows a forward/backward
    return model, Job(settings, trl_microbatch=8, gpu_memory_gb=args.gpu_memory_gb)
