"""Completion tokens/s of oncurve's TorchSampler against `model.generate(num_return_sequences=G)`.

Same model, prompts and sampling settings (temperature 1, no top-k/top-p); the samplers run
alternately, several repeats, after one warm-up call each; the table gives the median time, the
tokens/s, the ratio to `model.generate`, the FLOP floor (2 x parameters x generated tokens at
this machine's fp32 matmul rate, measured at the decode's largest matmul shape) and how far above
it each sampler is, and the peak memory of one call (RSS above the start, in a separate pass).

    python benchmarks/rollout.py                 # both scenarios of issue 3
    python benchmarks/rollout.py --model 30m     # one scenario: tiny|default|30m|PATH
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load_model, markdown_table, matmul_gflops, peak_memory  # noqa: E402

from oncurve.rollout import SamplingParams, TorchSampler  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "rollout.md"
# model -> (prompts, group size, new tokens, force full length)
SCENARIOS = {"tiny": (16, 8, 64, False), "default": (16, 8, 64, False), "30m": (8, 8, 128, True)}


def make_prompts(count: int) -> list[str]:
    """Arithmetic prompts of different lengths (so left padding is exercised)."""
    return [f"{17 * i + 3}+{(i * 7919) % 10 ** (1 + i % 4)}=" for i in range(count)]


def hf_generate(model, tokenizer, prompts, group, new, force):
    """`model.generate` as TRL calls it without vLLM; returns completion tokens generated."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(
        **enc,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        num_return_sequences=group,
        max_new_tokens=new,
        min_new_tokens=new if force else 0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    completion = out[:, enc["input_ids"].shape[1] :]
    is_eos = completion == tokenizer.eos_token_id
    # tokens up to and including the first EOS
    lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, completion.shape[1])
    return int(lengths.sum())


def run_scenario(name: str, repeats: int, generic: bool) -> tuple[str, list[float]]:
    prompts_n, group, new, force = SCENARIOS.get(name, SCENARIOS["30m"])
    model, tokenizer = load_model(name)
    prompts = make_prompts(prompts_n)
    params = SamplingParams(max_new_tokens=new, min_new_tokens=new if force else 0)
    samplers = {"oncurve": TorchSampler(model, tokenizer)}
    if generic:
        samplers["oncurve (generic HF step)"] = TorchSampler(model, tokenizer, fast=False)

    def ours(sampler):
        return lambda: int(sampler.generate(prompts, group, params).completion_mask.sum())

    calls = {label: ours(s) for label, s in samplers.items()}
    calls["model.generate"] = lambda: hf_generate(model, tokenizer, prompts, group, new, force)
    for call in calls.values():  # warm-up
        call()
    times: dict[str, list[float]] = {label: [] for label in calls}
    tokens: dict[str, list[int]] = {label: [] for label in calls}
    for _ in range(repeats):
        for label, call in calls.items():
            start = time.perf_counter()
            tokens[label].append(call())
            times[label].append(time.perf_counter() - start)
    memory = {label: peak_memory(call)[1] for label, call in calls.items()}

    config = model.config
    rate = matmul_gflops(prompts_n * group, config.hidden_size, config.intermediate_size)
    params_n = model.num_parameters()
    base_tps = sum(tokens["model.generate"]) / sum(times["model.generate"])
    rows, ratios = [], []
    for label in calls:
        seconds = statistics.median(times[label])
        tps = sum(tokens[label]) / sum(times[label])
        mean_tokens = statistics.mean(tokens[label])
        floor = 2 * params_n * mean_tokens / (rate * 1e9)
        ratio = tps / base_tps
        if label == "oncurve":
            ratios.append(ratio)
        rows.append(
            [
                label,
                f"{mean_tokens:.0f}",
                f"{seconds:.3f}",
                f"{tps:,.0f}",
                f"{ratio:.2f}x",
                f"{floor * 1e3:.1f} ms",
                f"{seconds / floor:.1f}x",
                f"{memory[label]:.1f}",
            ]
        )
    header = [
        "sampler",
        "tokens",
        "median s",
        "tokens/s",
        "vs generate",
        "FLOP floor",
        "x floor",
        "peak MB",
    ]
    title = (
        f"### {name}: {params_n / 1e6:.2f}M params, {prompts_n} prompts x G={group}, "
        f"{new} new tokens{' (forced full length)' if force else ''}, {repeats} repeats\n\n"
        f"fp32 matmul rate at [{prompts_n * group}, {config.hidden_size}] x "
        f"[{config.hidden_size}, {config.intermediate_size}]: {rate:.1f} GFLOP/s; "
        f"torch threads: {torch.get_num_threads()}\n\n"
    )
    return title + markdown_table(header, rows) + "\n", ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="tiny | default | 30m | PATH (default: tiny and 30m)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-generic", action="store_true", help="skip the generic HF path")
    args = parser.parse_args()
    names = [args.model] if args.model else ["tiny", "30m"]
    sections = []
    for name in names:
        section, _ = run_scenario(name, args.repeats, not args.no_generic)
        print(section, flush=True)
        sections.append(section)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        "# Rollout benchmark\n\nWritten by `python benchmarks/rollout.py"
        + (f" --model {args.model}" if args.model else "")
        + "`.\n\n"
        + "\n".join(sections)
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
