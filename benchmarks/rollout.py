"""Completion tokens/s of each sampler backend against `model.generate(num_return_sequences=G)`.

    python benchmarks/rollout.py                 # the tiny and 30m scenarios
    python benchmarks/rollout.py --model 30m     # one scenario: tiny|default|30m|PATH
    python benchmarks/rollout.py --backends hf   # some backends only
    python benchmarks/rollout.py --device cuda   # GPU: 0.5B model, the four scenarios below
    python benchmarks/rollout.py --device cuda --cuda-shapes 64x256,256x256 --repeats 1 --no-gaps

Same model, prompts and sampling (temperature 1, no top-k/top-p) for every sampler; scenarios,
samplers, how each device times them and the columns: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import copy
import functools
import subprocess
import sys
from typing import Any

from harness import sampling
from harness.children import isolated_env, peak_memory
from harness.machine import gpu_name
from harness.models import end_at_eos, load_model
from harness.records import context
from harness.tables import publish

from oncurve.rollout import BACKENDS, SamplingParams

TITLE = (
    "Rollout benchmark\n\nWritten by `python benchmarks/rollout.py [--model NAME]`; each run "
    "replaces the sections of the models it ran."
)
# model -> (prompts, group size, new tokens, force full length); a path takes 30m's
SCENARIOS = {"tiny": (16, 8, 64, False), "default": (16, 8, 64, False), "30m": (8, 8, 128, True)}
CUDA_SHAPES = "64x256,256x256,64x1024,64x1024~256"
GROUP = 8  # G on CUDA


def cpu_calls(name: str, backends: list[str]) -> tuple[dict, dict, Any]:
    """The samplers of scenario `name` (`backends`, then `model.generate`) as calls, the same
    on a tiny job (one prompt, G=1, 2 tokens: imports and first-call allocations), the model."""
    prompts_n, group, new, force = SCENARIOS.get(name, SCENARIOS["30m"])
    model, tokenizer = load_model(name)
    samplers = sampling.samplers(model, tokenizer, backends)

    def calls(prompts: list[str], group: int, new: int) -> dict[str, sampling.Call]:
        params = SamplingParams(max_new_tokens=new, min_new_tokens=new if force else 0)
        made = {k: sampling.sampler_call(s, prompts, group, params) for k, s in samplers.items()}
        generate = sampling.generate_call(model, tokenizer, prompts, group, params)
        return made | {"model.generate": generate}

    prompts = sampling.make_prompts(prompts_n)
    return calls(prompts, group, new), calls(prompts[:1], 1, 2), model


def cpu_row(name: str, repeats: int, backends: list[str]) -> dict:
    """Scenario `name` on the CPU; each sampler's peak memory from a child (`--memory-of`)."""
    prompts_n, group, new, force = SCENARIOS.get(name, SCENARIOS["30m"])
    calls, _, model = cpu_calls(name, backends)

    def peak_mb(label: str) -> float:
        child = [sys.executable, __file__, "--model", name, "--memory-of", label, "--backends"]
        out = subprocess.run([*child, ",".join(backends)], env=isolated_env(),
                             capture_output=True, text=True, check=True)  # fmt: skip
        return float(out.stdout.strip().splitlines()[-1])

    figures = sampling.measure_cpu(calls, repeats, model, prompts_n * group, peak_mb)
    return {"scenario": name, "prompts": prompts_n, "group": group, "new_tokens": new,
            "forced": force, "repeats": repeats, **figures}  # fmt: skip


def cuda_row(model: Any, tokenizer: Any, shape: tuple, args: argparse.Namespace,
             backends: list[str], done: list[dict]) -> dict:  # fmt: skip
    """One GPU scenario (`sampling.cuda_shape`): static-cache `generate` first, the baseline,
    then the samplers and, unless `--quick`, their variants and dynamic-cache `generate`; the
    records of this and the `done` scenarios go to `--json` after each sampler."""
    rows, new, mean_length = shape
    prompts = sampling.make_prompts(rows // GROUP)
    forced = new if mean_length is None else 0
    params = SamplingParams(max_new_tokens=new, min_new_tokens=forced, seed=0)
    if not forced:  # a copy, so that the forced shapes' model stays as it is
        model = copy.deepcopy(model)
        end_at_eos(model, tokenizer.eos_token_id, mean_length)
    samplers = sampling.samplers(model, tokenizer, backends, variants=not args.quick)
    generate = functools.partial(sampling.generate_call, model, tokenizer, prompts, GROUP, params)
    calls = {"model.generate (static cache)": (generate("static"), None)}
    calls |= {k: (sampling.sampler_call(s, prompts, GROUP, params), s) for k, s in samplers.items()}
    if not args.quick:
        calls["model.generate (dynamic cache)"] = (generate(None), None)
    scenario = f"{rows}x{new}" + (f"~{mean_length}" if mean_length else "")
    records = sampling.time_on_gpu(scenario, calls, args.repeats, rows, args.json, done)
    gaps = {} if args.no_gaps else {
        k: sampling.logprob_gap(model, s, prompts, GROUP, params) for k, s in samplers.items()
    }  # fmt: skip
    return {"scenario": scenario, "rows": rows, "group": GROUP, "new_tokens": new,
            "mean_length": mean_length, "repeats": args.repeats, "gpu": gpu_name(),
            "samplers": records, "logprob_gaps": gaps}  # fmt: skip


def record(row: dict) -> None:
    """Print the row's section and record it as its model's, on a GPU its scenario and card's."""
    key = f"cuda-{row['scenario']}, {row['gpu']}" if "gpu" in row else row["scenario"]
    print(sampling.section(context() | row), flush=True)
    publish("rollout", TITLE, key, {"renderer": "harness.sampling", **row})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--model", help="tiny | default | 30m | PATH (default: tiny and 30m)")
    add("--repeats", type=int, default=5)
    add("--backends", help="comma-separated sampler backends (default: hf,cpu_llama; "
        "cuda_graph,hf on CUDA)")  # fmt: skip
    add("--device", default="cpu", choices=("cpu", "cuda"))
    add("--cuda-shapes", default=CUDA_SHAPES,
        type=lambda text: [sampling.cuda_shape(part) for part in text.split(",") if part],
        help="with --device cuda: ROWSxTOKENS (forced lengths) or ROWSxTOKENS~MEAN (varying), "
        f"comma-separated (default {CUDA_SHAPES})")  # fmt: skip
    add("--no-gaps", action="store_true", help="with --device cuda: skip the logprob gaps")
    add("--json", help="with --device cuda: also write the records to this file")
    add("--quick", action="store_true", help="with --device cuda: only static-cache generate "
        "and the samplers as a run builds them")  # fmt: skip
    add("--memory-of", help=argparse.SUPPRESS)  # child: one sampler's peak MB
    args = parser.parse_args()
    default = "cuda_graph,hf" if args.device == "cuda" else "hf,cpu_llama"
    backends = [b for b in (args.backends or default).split(",") if b]
    if unknown := set(backends) - set(BACKENDS):
        parser.error(f"unknown backends {sorted(unknown)}; choose from {', '.join(BACKENDS)}")
    if args.memory_of:
        calls, small, _ = cpu_calls(args.model, backends)
        small[args.memory_of]()
        print(peak_memory(calls[args.memory_of])[1])
    elif args.device == "cuda":
        (model, tokenizer), done = sampling.cuda_model(), []
        for shape in args.cuda_shapes:
            row = cuda_row(model, tokenizer, shape, args, backends, done)
            done += row["samplers"]
            record(row)
    else:
        for name in [args.model] if args.model else ["tiny", "30m"]:
            record(cpu_row(name, args.repeats, backends))


if __name__ == "__main__":
    main()
