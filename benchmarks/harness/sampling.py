"""Samplers against `model.generate` for `rollout.py`: calls returning the tokens they made,
timed on the CPU or a GPU; a sampler's logprob gap to the training forward; a row's section."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import string
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

from harness.machine import load_note, matmul_gflops, torch_threads
from harness.models import build_model, tokenizer_dir
from harness.tables import markdown_table
from oncurve.model.forward import completion_logprobs
from oncurve.rollout import build_sampler
from oncurve.rollout.cuda_graph import GraphSampler

Call = Callable[[], int]  # one sampling call; returns the completion tokens it generated
CPU_COLUMNS = {"sampler": "{sampler}", "tokens": "{tokens:.0f}", "median s": "{median_s:.3f}",
               "tokens/s": "{tokens_per_s:,.0f}", "vs generate": "{vs_generate:.2f}x",
               "same repeat": "{same_repeat:.2f}x", "FLOP floor": "{floor_ms:.1f} ms",
               "x floor": "{x_floor:.1f}x", "peak MB": "{peak_mb:.1f}"}  # fmt: skip
GPU_COLUMNS = {"sampler": "{sampler}", "tokens": "{tokens}", "mean length": "{mean_length:.0f}",
               "best s": "{best_s:.3f}", "tokens/s": "{tokens_per_s:,.0f}",
               "vs static generate": "{vs_static:.2f}x", "first call s": "{first_call_s:.1f}",
               "compile s": "{compile_s:.1f}", "capture s": "{capture_s:.1f}"}  # fmt: skip


def make_prompts(count: int) -> list[str]:
    """Arithmetic prompts of different lengths (so left padding is exercised)."""
    return [f"{17 * i + 3}+{(i * 7919) % 10 ** (1 + i % 4)}=" for i in range(count)]


def sampler_call(sampler: Any, prompts: list[str], group: int, params: Any) -> Call:
    """`sampler.generate(prompts, group, params)` as a call."""
    return lambda: int(sampler.generate(prompts, group, params).completion_mask.sum())


def generate_call(model: Any, tokenizer: Any, prompts: list[str], group: int, params: Any,
                  cache: str | None = None) -> Call:  # fmt: skip
    """`model.generate` as TRL calls it without vLLM, `params`' token limits, `cache` its
    `cache_implementation` (None: dynamic)."""

    def call() -> int:
        enc = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
        out = model.generate(
            **enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            num_return_sequences=group, max_new_tokens=params.max_new_tokens,
            min_new_tokens=params.min_new_tokens, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id, cache_implementation=cache,
        )  # fmt: skip
        completion = out[:, enc["input_ids"].shape[1] :]
        is_eos = completion == tokenizer.eos_token_id
        # tokens up to and including the first EOS (generate pads the rest)
        lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, completion.shape[1])
        return int(lengths.sum())

    return call


def time_call(call: Callable, sync: Callable[[], None] = lambda: None) -> tuple[Any, float]:
    """(`call()`, seconds), `sync` run before each reading of the clock."""
    sync()
    start = time.perf_counter()
    result = call()
    sync()
    return result, time.perf_counter() - start


def measure_cpu(calls: dict[str, Call], repeats: int, model: Any, rows: int,
                peak_mb: Callable[[str], float]) -> dict[str, Any]:  # fmt: skip
    """A CPU scenario: a warm-up call each, then `repeats` rounds alternating (the last call the
    baseline) between two readings of the load and of the decode's matmul rate; each call's
    `CPU_COLUMNS` figures (FLOP floor: 2 x parameters x tokens at the better rate)."""
    shape = [rows, model.config.hidden_size, model.config.intermediate_size]
    rate, load_before = matmul_gflops(*shape), load_note()
    for call in calls.values():
        call()
    rounds = [{label: time_call(call) for label, call in calls.items()} for _ in range(repeats)]
    runs = {label: [timed[label] for timed in rounds] for label in calls}
    rate, load_after = max(rate, matmul_gflops(*shape)), load_note()
    speed = {label: statistics.median(n / s for n, s in timed) for label, timed in runs.items()}
    base = list(calls)[-1]
    samplers = []
    for label, timed in runs.items():
        tokens = statistics.mean(n for n, _ in timed)
        seconds = statistics.median(s for _, s in timed)
        floor = 2 * model.num_parameters() * tokens / (rate * 1e9)
        pairs = zip(timed, runs[base], strict=True)
        samplers.append({
            "sampler": label, "tokens": tokens, "median_s": seconds, "tokens_per_s": speed[label],
            "vs_generate": speed[label] / speed[base],
            "same_repeat": statistics.median((n / s) / (bn / bs) for (n, s), (bn, bs) in pairs),
            "floor_ms": floor * 1e3, "x_floor": seconds / floor, "peak_mb": peak_mb(label),
        })  # fmt: skip
    return {"params": model.num_parameters(), "matmul_shape": shape, "matmul_gflops": rate,
            "torch_threads": torch_threads(), "load_before": load_before,
            "load_after": load_after, "samplers": samplers}  # fmt: skip


def cuda_model() -> tuple[Any, Any]:
    """`gpu_vs_trl.py`'s random Qwen2.5-0.5B shape in bf16 on the GPU, and its tokenizer."""
    path = build_model("qwen2.5-0.5b", tokenizer_dir(None))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, padding_side="left")
    return model.to("cuda").eval(), tokenizer


def samplers(model: Any, tokenizer: Any, backends: list[str], variants: bool = False) -> dict:
    """The samplers of `backends` by name; with `variants`, a compiling `cuda_graph` also
    uncompiled and compiled once with symbolic sizes."""
    made = {backend: build_sampler(backend, model, tokenizer) for backend in backends}
    if variants and "cuda_graph" in made and made["cuda_graph"].compile_step:
        made["cuda_graph, uncompiled"] = GraphSampler(model, tokenizer, compile_step=False)
        made["cuda_graph, one dynamic compile"] = GraphSampler(
            model, tokenizer, dynamic_compile=True
        )
    return made


def time_on_gpu(scenario: str, calls: dict[str, tuple[Call, Any]], repeats: int, rows: int,
                json_path: str | None, earlier: list[dict]) -> list[dict[str, Any]]:  # fmt: skip
    """A `GPU_COLUMNS` record per call (label -> (call, sampler or None)): first call apart, best
    of `repeats` by tokens/s against the first label's; `earlier` and the records so far written
    to `json_path` (if given) after each."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    records: list[dict[str, Any]] = []
    for label, (call, sampler) in calls.items():
        first = time_call(call, sync)[1]
        runs = [time_call(call, sync) for _ in range(repeats)]
        tokens, seconds = max(runs, key=lambda run: run[0] / run[1])
        base = records[0]["tokens_per_s"] if records else tokens / seconds
        records.append({
            "scenario": scenario, "sampler": label, "tokens": tokens,
            "mean_length": statistics.mean(n for n, _ in runs) / rows, "best_s": seconds,
            "tokens_per_s": tokens / seconds, "first_call_s": first,
            "capture_s": getattr(sampler, "capture_seconds", None),
            "compile_s": getattr(sampler, "compile_seconds", None),
            "vs_static": tokens / seconds / base,
        })  # fmt: skip
        if json_path:
            Path(json_path).write_text(json.dumps(earlier + records))
    return records


def logprob_gap(model: Any, sampler: Any, prompts: list[str], group: int,
                params: Any) -> tuple[float, float]:  # fmt: skip
    """Mean and max |sampler - training forward logprob| over one call's completion tokens."""
    batch = sampler.generate(prompts, group, params)
    with torch.no_grad():
        trained, _ = completion_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.completion_ids.shape[1],
            chunk_size=256,
        )  # fmt: skip
    gap = (trained - batch.logprobs).abs()[batch.completion_mask.bool()]
    return float(gap.mean()), float(gap.max())


def cuda_shape(text: str) -> tuple[int, int, int | None]:
    """argparse type: `ROWSxTOKENS[~MEAN]` as (rows, tokens, mean length or None)."""
    match = re.fullmatch(r"(\d+)x(\d+)(?:~(\d+))?", text.strip().lower())
    rows, tokens, mean = (int(n) if n else None for n in match.groups()) if match else (0, 0, 0)
    if not rows or rows % 8 or not tokens or (mean is not None and not 1 < mean <= tokens):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not ROWSxTOKENS or ROWSxTOKENS~MEAN with ROWS a positive multiple of 8 "
            "and 1 < MEAN <= TOKENS, e.g. 64x256 or 64x1024~256"
        )
    return rows, tokens, mean


def table(columns: dict[str, str], records: list[dict[str, Any]], missing: str) -> str:
    """A markdown table, a row per record, each column's format filled (`missing` for None)."""

    def fill(form: str, record: dict[str, Any]) -> str:
        names = [name for _, name, _, _ in string.Formatter().parse(form) if name]
        return missing if any(record.get(n) is None for n in names) else form.format(**record)

    return markdown_table(list(columns), [[fill(f, r) for f in columns.values()] for r in records])


def summary(row: dict[str, Any]) -> str:
    """Each sampler's tokens/s against the baseline `generate`, in one line."""
    key = "vs_static" if "gpu" in row else "vs_generate"
    samplers = "; ".join(f"`{s['sampler']}` {s['tokens_per_s']:,.0f} tokens/s = {s[key]:.2f}x"
                         for s in row["samplers"])  # fmt: skip
    return f"{row['scenario']}: {samplers}"


def headline(row: dict[str, Any]) -> dict[str, str] | None:
    """The README's figure of a forced-length GPU scenario: `cuda_graph` against static-cache
    `generate`, an area per GPU model."""
    graph = next((s for s in row["samplers"] if s["sampler"] == "cuda_graph"), None)
    if "gpu" not in row or row["mean_length"] is not None or graph is None:
        return None
    card = row["gpu"].replace("NVIDIA ", "").split()[0]
    return {
        "area": f"the sampler, 1 x {card}",
        "figure": f"{graph['vs_static']:.2f}x static-cache `generate` "
        f"({row['rows']} x {row['new_tokens']})",
        "command": "benchmarks/rollout.py --device cuda",
    }


def section(row: dict[str, Any]) -> str:
    """A scenario's section of `results/rollout.md`: how it was measured, a line per sampler,
    on a GPU their logprob gaps."""
    measured = f"measured {row['date']}" + (f" at {row['commit']}" if row.get("commit") else "")
    measured += f", `{row['command']}`" if row.get("command") else ""
    if versions := row.get("versions"):
        measured += f" with torch {versions['torch']}, transformers {versions['transformers']}"
    measured += f"; {row['note']}" if row.get("note") else ""
    if "rows" not in row:
        rows, inner, cols = row["matmul_shape"]
        return (
            f"### {row['scenario']}: {row['params'] / 1e6:.2f}M params, {row['prompts']} prompts "
            f"x G={row['group']}, {row['new_tokens']} new tokens"
            f"{' (forced full length)' if row['forced'] else ''}, {row['repeats']} repeats\n\n"
            f"fp32 matmul rate at [{rows}, {inner}] x [{inner}, {cols}]: "
            f"{row['matmul_gflops']:.1f} GFLOP/s (best of two measurements); torch threads: "
            f"{row['torch_threads']}; before: {row['load_before']}; after: {row['load_after']}; "
            f"{measured}\n\n{table(CPU_COLUMNS, row['samplers'], 'n/a')}\n"
        )
    new, mean = row["new_tokens"], row["mean_length"]
    lengths = (
        f"{new} new tokens forced"
        if mean is None
        else f"lengths roughly geometric with mean {mean} (EOS logit raised), cut at {new}"
    )
    gaps = "".join(
        f"- `{label}`: its logprobs against the training forward's, mean |diff| {average:.2e}, "
        f"max {largest:.2e}\n"
        for label, (average, largest) in row["logprob_gaps"].items()
    )
    return (
        f"### cuda-{row['scenario']}: random Qwen2.5-0.5B shape, bf16, "
        f"{row['rows'] // row['group']} prompts x G={row['group']}, {lengths}, best of "
        f"{row['repeats']} (by tokens/s)\n\n{row['gpu']}; {measured}\n\n"
        f"{table(GPU_COLUMNS, row['samplers'], '')}\n{gaps}"
    )
