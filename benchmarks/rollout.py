"""Completion tokens/s of each sampler backend against `model.generate(num_return_sequences=G)`.

One row per backend of `oncurve.rollout.BACKENDS` (or of `--backends`), and one for
`model.generate`. Same model, prompts and sampling settings (temperature 1, no top-k/top-p); the
samplers run alternately, several repeats, after one warm-up call each. The table gives the
median time and tokens/s; the ratio to `model.generate`, both of the medians and as the median
of the ratios within a repeat (which drift in the machine's speed between repeats moves less);
the FLOP floor (2 x parameters x generated tokens at this machine's fp32 matmul rate, measured
at the decode's largest matmul shape) and how far above it each sampler is; and the peak memory
of one call (RSS above the start, each sampler in a fresh process after a small warm-up call;
see `harness.children.peak_memory`).

    python benchmarks/rollout.py                 # both scenarios of issue 3
    python benchmarks/rollout.py --model 30m     # one scenario: tiny|default|30m|PATH
    python benchmarks/rollout.py --backends hf   # some backends only
    python benchmarks/rollout.py --device cuda   # GPU: 0.5B model, the four scenarios below
    python benchmarks/rollout.py --device cuda --cuda-shapes 64x256,256x256 --repeats 1 --no-gaps

On CUDA (`--device cuda`) the rows are the GPU backends (`cuda_graph` compiled per bucket and
captured, as a run on CUDA samples by default, `cuda_graph` compiled once with symbolic sizes
(`dynamic_compile`), and `cuda_graph` captured without compiling) and
`model.generate` with its dynamic cache (what TRL samples with) and its static cache
(transformers compiles the static decode step and replays it as a CUDA graph); each sampler is
warmed up first (its first call timed apart, and within it the sampler's compiling and
capturing), then the best of `--repeats` calls counts, bf16. Its model is `gpu_vs_trl.py`'s
random Qwen2.5-0.5B shape (the Qwen3 tokenizer from ../shared or benchmarks/.gpu-bundle).
`--cuda-shapes` lists the scenarios as ROWSxTOKENS (rows = prompts x G=8, every row forced to
the full length; default 64x256, 256x256, 64x1024) or ROWSxTOKENS~MEAN, lengths that vary as in
a real run: the model's EOS logit is raised (`raise_eos`) so that lengths are roughly geometric
with mean MEAN, cut at TOKENS, the same model for every sampler (default 64x1024~256), where
moving finished rows to smaller graphs and prefilling each prompt once for its G rows count.
`--no-gaps` leaves out the logprob gap to the training forward, `--quick` the dynamic cache and
the `cuda_graph` variants a run does not use, and `--json PATH` also writes the measurements as
JSON (what `gpu_check.py` reads).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from harness.children import isolated_env, peak_memory
from harness.machine import load_note, matmul_gflops
from harness.models import load_model
from harness.records import latest, read
from harness.tables import markdown_table, publish

from oncurve.rollout import BACKENDS, SamplingParams, build_sampler
from oncurve.rollout.cuda_graph import GraphSampler

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


def make_calls(name: str, backends: list[str]) -> tuple[dict, object, tuple]:
    """The samplers of one scenario (`backends`, then `model.generate`) as zero-argument calls
    returning tokens generated, and a warm-up call per sampler on a tiny job (imports,
    first-call allocations)."""
    prompts_n, group, new, force = SCENARIOS.get(name, SCENARIOS["30m"])
    model, tokenizer = load_model(name)
    prompts = make_prompts(prompts_n)

    def ours(sampler, prompts, group, new):
        params = SamplingParams(max_new_tokens=new, min_new_tokens=new if force else 0)
        return lambda: int(sampler.generate(prompts, group, params).completion_mask.sum())

    def generate(prompts, group, new):
        return lambda: hf_generate(model, tokenizer, prompts, group, new, force)

    samplers = {backend: build_sampler(backend, model, tokenizer) for backend in backends}
    calls = {label: ours(s, prompts, group, new) for label, s in samplers.items()}
    calls["model.generate"] = generate(prompts, group, new)
    small = {label: ours(s, prompts[:1], 1, 2) for label, s in samplers.items()}
    small["model.generate"] = generate(prompts[:1], 1, 2)
    return calls, small, (model, prompts_n, group, new, force)


def child_memory(name: str, label: str, backends: list[str]) -> float:
    """Peak MB of one call of sampler `label`, measured in a fresh process."""
    out = subprocess.run(
        [sys.executable, __file__, "--model", name, "--memory-of", label]
        + ["--backends", ",".join(backends)],
        env=isolated_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def run_scenario(name: str, repeats: int, backends: list[str]) -> str:
    calls, small, (model, prompts_n, group, new, force) = make_calls(name, backends)
    config = model.config
    shape = (prompts_n * group, config.hidden_size, config.intermediate_size)
    rate = matmul_gflops(*shape)
    load_before = load_note()
    for call in calls.values():  # warm-up
        call()
    times: dict[str, list[float]] = {label: [] for label in calls}
    tokens: dict[str, list[int]] = {label: [] for label in calls}
    for _ in range(repeats):
        for label, call in calls.items():
            start = time.perf_counter()
            tokens[label].append(call())
            times[label].append(time.perf_counter() - start)
    rate = max(rate, matmul_gflops(*shape))
    load_after = load_note()
    memory = {label: child_memory(name, label, backends) for label in calls}

    def median_tps(label: str) -> float:
        return statistics.median(n / s for n, s in zip(tokens[label], times[label], strict=True))

    def paired_ratio(label: str) -> float:
        """Median over repeats of this sampler's tokens/s over `model.generate`'s in the same
        repeat: the two ran seconds apart, so a machine whose speed drifts moves both."""
        per_repeat = zip(
            tokens[label],
            times[label],
            tokens["model.generate"],
            times["model.generate"],
            strict=True,
        )
        return statistics.median((n / s) / (gn / gs) for n, s, gn, gs in per_repeat)

    params_n = model.num_parameters()
    base_tps = median_tps("model.generate")
    rows = []
    for label in calls:
        seconds = statistics.median(times[label])
        tps = median_tps(label)
        mean_tokens = statistics.mean(tokens[label])
        floor = 2 * params_n * mean_tokens / (rate * 1e9)
        ratio = tps / base_tps
        rows.append(
            [
                label,
                f"{mean_tokens:.0f}",
                f"{seconds:.3f}",
                f"{tps:,.0f}",
                f"{ratio:.2f}x",
                f"{paired_ratio(label):.2f}x",
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
        "same repeat",
        "FLOP floor",
        "x floor",
        "peak MB",
    ]
    title = (
        f"### {name}: {params_n / 1e6:.2f}M params, {prompts_n} prompts x G={group}, "
        f"{new} new tokens{' (forced full length)' if force else ''}, {repeats} repeats\n\n"
        f"fp32 matmul rate at [{shape[0]}, {shape[1]}] x [{shape[1]}, {shape[2]}]: "
        f"{rate:.1f} GFLOP/s (best of two measurements); torch threads: "
        f"{torch.get_num_threads()}; before: {load_before}; after: {load_after}; measured "
        f"{time.strftime('%Y-%m-%d')} with torch {torch.__version__}, "
        f"transformers {transformers.__version__}\n\n"
    )
    return title + markdown_table(header, rows) + "\n"


def cuda_model() -> tuple[transformers.PreTrainedModel, object]:
    """`gpu_vs_trl.py`'s random Qwen2.5-0.5B shape in bf16 on the GPU, and its tokenizer."""
    from harness.models import build_model, tokenizer_dir

    path = build_model("qwen2.5-0.5b", tokenizer_dir(None))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, padding_side="left")
    return model.to("cuda").eval(), tokenizer


def raise_eos(
    model: transformers.PreTrainedModel, eos_id: int, mean_length: float
) -> torch.nn.Module:
    """Give `model` an output head whose EOS logit is raised by a constant, chosen so that EOS
    is drawn with probability 1 / `mean_length` per token on average over the positions of
    random sequences (completion lengths then roughly geometric with that mean); the head's
    weight stays the same tensor (tied embeddings stay tied). Returns the old head, to put
    back with `set_output_embeddings`."""
    old = model.get_output_embeddings()
    ids = torch.randint(model.config.vocab_size, (8, 64), device=old.weight.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float().flatten(0, 1)  # [positions, V]
    eos = logits[:, eos_id].clone()
    logits[:, eos_id] = float("-inf")
    # EOS's probability with a bias b is sigmoid(b - gap): bisect for b
    gap = torch.logsumexp(logits, dim=-1) - eos
    low, high = -100.0, 100.0
    for _ in range(60):
        bias = (low + high) / 2
        if float(torch.sigmoid(bias - gap).mean()) < 1 / mean_length:
            low = bias
        else:
            high = bias
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    head.to(device=old.weight.device, dtype=old.weight.dtype)
    head.weight = old.weight
    with torch.no_grad():
        head.bias.zero_()
        if old.bias is not None:
            head.bias.copy_(old.bias)
        head.bias[eos_id] += bias
    model.set_output_embeddings(head)
    return old


def run_cuda(
    model,
    tokenizer,
    rows: int,
    new_tokens: int,
    mean_length: int | None,
    repeats: int,
    backends: list[str],
    gaps: bool,
    measured: Callable[[list[dict]], None] = lambda records: None,
    variants: bool = True,
) -> tuple[str, list[dict]]:
    """One GPU scenario: `rows` // 8 prompts x G=8, best of `repeats`, every row forced to
    `new_tokens`, or with `mean_length` lengths roughly geometric with that mean (cut at
    `new_tokens`). `generate` with the static cache, the baseline, runs first, and
    `measured` gets the records after each sampler (a run stopped at a time limit keeps
    them). Without `variants`, only the static cache's `generate` and the samplers as a run
    builds them. Returns its markdown section and one record per sampler."""
    group = 8
    prompts = make_prompts(rows // group)
    forced = new_tokens if mean_length is None else 0
    params = SamplingParams(max_new_tokens=new_tokens, min_new_tokens=forced, seed=0)
    device = model.device

    def sync() -> None:  # so that the clock stops when the device is done
        if device.type == "cuda":
            torch.cuda.synchronize()

    def ours(sampler) -> int:
        return int(sampler.generate(prompts, group, params).completion_mask.sum())

    def generate(cache: str | None) -> int:
        enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
        out = model.generate(
            **enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            num_return_sequences=group, max_new_tokens=new_tokens, min_new_tokens=forced,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            cache_implementation=cache,
        )  # fmt: skip
        completion = out[:, enc["input_ids"].shape[1] :]
        is_eos = completion == tokenizer.eos_token_id
        # tokens up to and including the first EOS (generate pads the rest)
        lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, completion.shape[1])
        return int(lengths.sum())

    old_head = (
        None if mean_length is None else raise_eos(model, tokenizer.eos_token_id, mean_length)
    )
    samplers = {backend: build_sampler(backend, model, tokenizer) for backend in backends}
    if variants and "cuda_graph" in samplers and samplers["cuda_graph"].compile_step:
        samplers["cuda_graph, uncompiled"] = GraphSampler(model, tokenizer, compile_step=False)
        samplers["cuda_graph, one dynamic compile"] = GraphSampler(
            model, tokenizer, dynamic_compile=True
        )
    calls = {"model.generate (static cache)": lambda: generate("static")}
    calls |= {label: (lambda s=s: ours(s)) for label, s in samplers.items()}
    if variants:
        calls["model.generate (dynamic cache)"] = lambda: generate(None)
    records = []
    try:
        for label, call in calls.items():
            sync()
            start = time.perf_counter()
            call()  # warm-up: compilation, graph capture
            sync()
            first = time.perf_counter() - start
            seconds, tokens = [], []
            for _ in range(repeats):
                start = time.perf_counter()
                tokens.append(call())
                sync()
                seconds.append(time.perf_counter() - start)
            best = min(range(repeats), key=lambda i: seconds[i] / tokens[i])
            records.append(
                {
                    "scenario": f"{rows}x{new_tokens}" + (f"~{mean_length}" if mean_length else ""),
                    "sampler": label,
                    "tokens": tokens[best],
                    "mean_length": statistics.mean(tokens) / rows,
                    "best_s": seconds[best],
                    "tokens_per_s": tokens[best] / seconds[best],
                    "first_call_s": first,
                    "capture_s": getattr(samplers.get(label), "capture_seconds", None),
                    "compile_s": getattr(samplers.get(label), "compile_seconds", None),
                }
            )
            base = records[0]["tokens_per_s"]  # the static cache's
            records[-1]["vs_static"] = records[-1]["tokens_per_s"] / base
            measured(records)
        exactness = ""
        for label, sampler in samplers.items() if gaps else ():
            mean, largest = logprob_gap(model, sampler, prompts, group, params)
            exactness += (
                f"- `{label}`: its logprobs against the training forward's, mean |diff| "
                f"{mean:.2e}, max {largest:.2e}\n"
            )
    finally:
        if old_head is not None:
            model.set_output_embeddings(old_head)

    def seconds_or_blank(value: float | None) -> str:
        return "" if value is None else f"{value:.1f}"

    table = [
        [r["sampler"], str(r["tokens"]), f"{r['mean_length']:.0f}", f"{r['best_s']:.3f}",
         f"{r['tokens_per_s']:,.0f}", f"{r['vs_static']:.2f}x", f"{r['first_call_s']:.1f}",
         seconds_or_blank(r["compile_s"]), seconds_or_blank(r["capture_s"])]
        for r in records
    ]  # fmt: skip
    header = ["sampler", "tokens", "mean length", "best s", "tokens/s", "vs static generate",
              "first call s", "compile s", "capture s"]  # fmt: skip
    lengths = (
        f"{new_tokens} new tokens forced"
        if mean_length is None
        else f"lengths roughly geometric with mean {mean_length} (EOS logit raised), cut at "
        f"{new_tokens}"
    )
    name = device.type if device.type != "cuda" else torch.cuda.get_device_name()
    title = (
        f"### cuda-{records[0]['scenario']}: random Qwen2.5-0.5B shape, bf16, {rows // group} "
        f"prompts x G={group}, {lengths}, best of {repeats} (by tokens/s)\n\n"
        f"{name}; measured {time.strftime('%Y-%m-%d')} with torch "
        f"{torch.__version__}, transformers {transformers.__version__}\n\n"
    )
    return title + markdown_table(header, table) + "\n" + exactness, records


def cuda_shape(text: str) -> tuple[int, int, int | None]:
    """`ROWSxTOKENS` or `ROWSxTOKENS~MEAN` (rows a multiple of G=8) as (rows, tokens, mean
    length or None), for argparse."""
    shape, _, mean = text.lower().partition("~")
    try:
        rows, tokens = (int(part) for part in shape.split("x"))
        mean_length = int(mean) if mean else None
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not ROWSxTOKENS or ROWSxTOKENS~MEAN, e.g. 64x256 or 64x1024~256"
        ) from None
    if rows <= 0 or rows % 8 or tokens <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: rows must be a positive multiple of 8")
    if mean_length is not None and not 1 < mean_length <= tokens:
        raise argparse.ArgumentTypeError(f"{text!r}: MEAN must be in (1, TOKENS]")
    return rows, tokens, mean_length


def logprob_gap(model, sampler, prompts, group, params) -> tuple[float, float]:
    """Mean and max |sampler logprob - training forward logprob| over the completion tokens of
    one call (the TIS correction's input, `logprob_diff/*` in training)."""
    from oncurve.model.forward import completion_logprobs

    batch = sampler.generate(prompts, group, params)
    with torch.no_grad():
        trained, _ = completion_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.completion_ids.shape[1],
            chunk_size=256,
        )  # fmt: skip
    mask = batch.completion_mask.bool()
    gap = (trained - batch.logprobs).abs()[mask]
    return float(gap.mean()), float(gap.max())


def write_results(sections: dict[str, str]) -> None:
    """Record the page with the sections of the scenarios just run replacing theirs in the
    newest page of the record, the others kept."""
    page = latest(read("rollout")).get("", {}).get("markdown", "")
    kept = {part.split(":", 1)[0]: "### " + part for part in page.split("\n### ")[1:]}
    kept.update(sections)
    body = "\n".join(section.rstrip("\n") + "\n" for section in kept.values())
    title = "Rollout benchmark"
    page = (
        f"# {title}\n\nWritten by `python benchmarks/rollout.py [--model NAME]`; each run "
        "replaces the sections of the models it ran.\n\n" + body
    )
    publish("rollout", title, "", {"markdown": page})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="tiny | default | 30m | PATH (default: tiny and 30m)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--backends",
        help="comma-separated sampler backends (default: hf,cpu_llama; cuda_graph,hf on CUDA)",
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--cuda-shapes",
        type=lambda text: [cuda_shape(part) for part in text.split(",") if part],
        default=[(64, 256, None), (256, 256, None), (64, 1024, None), (64, 1024, 256)],
        help="with --device cuda: scenarios as ROWSxTOKENS (forced lengths) or "
        "ROWSxTOKENS~MEAN (varying lengths),... (default 64x256,256x256,64x1024,64x1024~256)",
    )
    parser.add_argument(
        "--no-gaps", action="store_true", help="with --device cuda: skip the logprob gaps"
    )
    parser.add_argument("--json", help="with --device cuda: also write the records to this file")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="with --device cuda: only static-cache generate and the samplers as a run builds them",
    )
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)  # child: one sampler's peak MB
    args = parser.parse_args()
    default = "cuda_graph,hf" if args.device == "cuda" else "hf,cpu_llama"
    backends = [b for b in (args.backends or default).split(",") if b]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; choose from {', '.join(BACKENDS)}")
    if args.device == "cuda":
        model, tokenizer = cuda_model()
        sections, records = {}, []

        def measured(scenario: list[dict]) -> None:
            if args.json:  # after each sampler: a later one may run out of time
                Path(args.json).write_text(json.dumps(records + scenario))

        for rows, tokens, mean_length in args.cuda_shapes:
            section, scenario = run_cuda(
                model, tokenizer, rows, tokens, mean_length, args.repeats, backends,
                not args.no_gaps, measured, not args.quick,
            )  # fmt: skip
            print(section, flush=True)
            sections[f"cuda-{scenario[0]['scenario']}"] = section
            records += scenario
        write_results(sections)
        return
    if args.memory_of:
        calls, small, _ = make_calls(args.model, backends)
        small[args.memory_of]()
        print(peak_memory(calls[args.memory_of])[1])
        return
    names = [args.model] if args.model else ["tiny", "30m"]
    sections = {}
    for name in names:
        sections[name] = run_scenario(name, args.repeats, backends)
        print(sections[name], flush=True)
    write_results(sections)


if __name__ == "__main__":
    main()
