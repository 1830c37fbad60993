"""Helpers shared by the benchmark scripts: models made from a config, the machine's matmul rate,
peak memory of a call, child processes, the timing hooks of a TRL child, and markdown tables.

Nothing here downloads anything: the named models are random Qwen2-style models built from a
config with the bundled character tokenizer; `default` is the bundled model once it exists.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

from oncurve.model.char_tokenizer import char_tokenizer

# What a GPU machine without internet access lacks, in one gitignored folder that the device
# tool carries (`gpu_check.py --prepare` fills it): `tokenizer/` (the Qwen3 tokenizer, from
# ../shared) and `wheels/` (TRL and what it needs beyond a CUDA torch image).
GPU_BUNDLE = Path(__file__).resolve().parent / ".gpu-bundle"

# name -> (hidden, intermediate, layers, heads, kv_heads); parameter counts with the char
# tokenizer's 104-token vocabulary and tied embeddings.
QWEN2_SIZES = {
    "tiny": (128, 512, 4, 4, 2),  # 0.99M
    "30m": (512, 1536, 10, 8, 2),  # 30.2M
}


def qwen2_config(
    shape: tuple[int, int, int, int, int], vocab_size: int, **extra: Any
) -> transformers.Qwen2Config:
    """A Qwen2 config with tied embeddings of `shape` (hidden, intermediate, layers, heads,
    kv_heads, as in `QWEN2_SIZES`); `extra` are further `Qwen2Config` fields."""
    hidden, intermediate, layers, heads, kv_heads = shape
    return transformers.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=True,
        **extra,
    )


def qwen2_model(name: str, vocab_size: int, seed: int = 0) -> transformers.PreTrainedModel:
    """A random Qwen2-style model of one of `QWEN2_SIZES`, float32, eval mode."""
    torch.manual_seed(seed)
    config = qwen2_config(QWEN2_SIZES[name], vocab_size, max_position_embeddings=512)
    return transformers.Qwen2ForCausalLM(config).eval()


def load_model(name: str) -> tuple[transformers.PreTrainedModel, Any]:
    """(model, tokenizer) for `default` (the bundled model), a `QWEN2_SIZES` name, or a path to
    a local Hugging Face model directory."""
    from oncurve.model.sources import load_model as load_dir
    from oncurve.model.sources import load_tokenizer, resolve_model_path

    if name in QWEN2_SIZES:
        tokenizer = char_tokenizer()
        model = qwen2_model(name, len(tokenizer))
        model.config.eos_token_id = tokenizer.eos_token_id
        model.config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        return model, tokenizer
    path = resolve_model_path(name)
    if not (Path(path) / "config.json").is_file():
        raise SystemExit(f"model {name}: {path} holds no model yet; use --model tiny")
    return load_dir(path), load_tokenizer(path)


def matmul_gflops(rows: int, inner: int, cols: int, seconds: float = 0.5) -> float:
    """fp32 GFLOP/s of torch's `[rows, inner] @ [inner, cols]` on this machine, best of a few
    timed batches and of both orientations (the product or its transpose, `[cols, inner] @
    [inner, rows]`: MKL is faster one way or the other depending on the shape, and a decode
    step with few rows uses the faster one), i.e. the floor those matmuls could reach."""
    flops = 2 * rows * inner * cols
    reps = max(1, int(2e8 / flops))
    best = float("inf")
    for m, n in ((rows, cols), (cols, rows)):
        a, b, out = torch.randn(m, inner), torch.randn(inner, n), torch.empty(m, n)
        deadline = time.perf_counter() + seconds / 2
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            for _ in range(reps):
                torch.matmul(a, b, out=out)
            best = min(best, (time.perf_counter() - start) / reps)
    return flops / best / 1e9


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def peak_memory(fn: Callable[[], Any], interval: float = 0.0005) -> tuple[Any, float]:
    """Run `fn` and return (its result, peak resident memory above the start, in MB).

    RSS is sampled by a thread every `interval` seconds, and the process's lifetime peak
    (`ru_maxrss`) counts too when `fn` raised it. RSS follows torch tensors only when freed
    memory goes back to the OS: run this in a fresh process started with
    `MALLOC_MMAP_THRESHOLD_` set low (see `isolated_env`), after a small warm-up call.
    """
    base = _rss_bytes()
    lifetime_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = base
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_bytes())
            time.sleep(interval)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        result = fn()
    finally:
        done.set()
        thread.join()
    lifetime = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = max(peak, _rss_bytes(), lifetime if lifetime > lifetime_before else 0)
    return result, (peak - base) / 2**20


def own_peak_rss() -> float | None:
    """This process's peak RSS in MB (Linux `VmHWM`), None elsewhere.

    Not `ru_maxrss` as the parent's `wait4` reports it: Python starts children with vfork, and
    Linux carries the parent's high-water mark into the child's `ru_maxrss` at exec, so a child
    smaller than its parent would show the parent's peak. `VmHWM` belongs to the process's own
    address space, created at exec.
    """
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else None


def isolated_env() -> dict[str, str]:
    """Environment for a memory-measuring child: glibc returns every allocation over 64 KB to
    the OS when freed, so RSS is the live memory rather than the heap's high-water mark."""
    return {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}


def load_note() -> str:
    """This machine's load, printed with results: other work on the cores slows every sampler."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} (1 / 5 min) on {os.cpu_count()} cores"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(path: Path, title: str, key: str, section: str) -> None:
    """Replace the section named `key` of the markdown file `path` (other sections stay),
    under a `# title` heading. Sections are delimited by `<!-- model: key -->` markers."""
    sections: dict[str, str] = {}
    if path.is_file():
        for chunk in path.read_text().split("<!-- model: ")[1:]:
            name, _, body = chunk.partition(" -->\n")
            sections[name] = body.strip("\n")
    sections[key] = section.strip("\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"# {title}\n\n"
        + "\n\n".join(f"<!-- model: {name} -->\n{body}" for name, body in sections.items())
        + "\n"
    )
    print(f"wrote {path} (section {key})")


def step_phases(rows: list[dict]) -> dict[str, list[float]]:
    """Seconds per phase of each step, from an oncurve run's metrics rows: the `time/<phase>`
    keys the trainer wrote (reference only when beta > 0), in the order a step runs them."""
    names = [k for k in ("rollout", "reward", "reference", "train") if f"time/{k}" in rows[0]]
    return {k: [r[f"time/{k}"] for r in rows] for k in names}


def run_child(
    command: list[str], env: dict[str, str], log: Path, check: bool = True
) -> tuple[float, float, int]:
    """Run `command` with its output in `log`; returns (wall seconds, peak RSS in MB of that
    process alone, exit status). A failure raises SystemExit with the log's tail unless `check`
    is false."""
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode and check:
        raise SystemExit(
            f"{' '.join(command[:4])} ... failed ({process.returncode}):\n{log_tail(log)}"
        )
    return time.perf_counter() - start, usage.ru_maxrss / 1024, process.returncode


def run_limited(
    command: list[str], env: dict[str, str], log: Path, limit: float, cwd: Path | None = None
) -> tuple[int | None, float]:
    """Run `command` (in `cwd`) with its output in `log` for at most `limit` seconds; returns
    (its exit status, or None when it ran out of time, wall seconds). The child leads a process
    group of its own, and on a timeout the whole group is killed: pytest's workers and a
    trainer's reward workers would otherwise live on, holding the GPU."""
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        try:
            code: int | None = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # the group ended meanwhile
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    return code, time.perf_counter() - start


def log_tail(log: Path, lines: int = 30) -> str:
    """The last `lines` lines of the text file `log` ("" when there is none)."""
    if not log.is_file():
        return ""
    return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:])


def sampler_setup_seconds(row: dict) -> float | None:
    """The sampler's compile plus capture seconds so far, from a step's metrics (None without
    the `cuda_graph` sampler)."""
    if "time/sampler_compile_total" not in row:
        return None
    return row["time/sampler_compile_total"] + row["time/sampler_capture_total"]


# phase -> (the trainer's stage, whose peak a step logs as `memory/<stage>_peak_gb`; the memory
# plan's name for the phase in its printed line)
PEAK_PHASES = {
    "sampling": ("rollout", "sampling"),
    "reference": ("reference", "reference pass"),
    "update": ("train", "training"),
}


def measured_phase_peaks_gb(rows: list[dict]) -> dict[str, float]:
    """The largest peak GiB of each phase over an oncurve run's steps (`PEAK_PHASES`; a
    phase the steps did not log, as on the CPU or with beta 0, is left out)."""
    peaks = {}
    for phase, (stage, _) in PEAK_PHASES.items():
        values = [r[f"memory/{stage}_peak_gb"] for r in rows if f"memory/{stage}_peak_gb" in r]
        if values:
            peaks[phase] = max(values)
    return peaks


def planned_phase_peaks_gb(log_text: str) -> dict[str, float]:
    """The peak GiB of each phase in the last memory plan an `oncurve train` process printed
    (`MemoryPlan.describe`); empty when it printed none."""
    lines = re.findall(r"memory plan: .*", log_text)
    if not lines:
        return {}
    found = dict(re.findall(r"(training|sampling|reference pass) ([0-9.]+)", lines[-1]))
    return {phase: float(found[name]) for phase, (_, name) in PEAK_PHASES.items() if name in found}


def planned_peak_gb(log_text: str) -> float | None:
    """The peak GiB of the memory plan an `oncurve train` process printed at start
    (`MemoryPlan.describe`), the last one in `log_text`; None when it printed none (the CPU)."""
    found = re.findall(r"memory plan: .*?predicted peak ([0-9.]+) GiB", log_text)
    return float(found[-1]) if found else None


# --- hooks of a TRL child (run in TRL's environment) -------------------------------------------


def trl_reward(name: str, fn: Callable, group: int, seen: list[list[str]]) -> Callable:
    """An oncurve reward fn as TRL calls it: keyword arguments, the dataset's columns included
    (TRL also passes `completion_ids`, `trainer_state`, ...: the fn's **columns absorbs them).
    Appends the prompt of each group of `group` rows of a call to `seen` (one per group, not
    the distinct ones: a step may draw one prompt text twice)."""

    def reward(prompts: list[str], completions: list[str], **columns) -> list[float | None]:
        seen.append(prompts[::group])
        return fn(prompts, completions, **columns)

    reward.__name__ = name  # TRL logs rewards/<__name__>
    return reward


def timed(
    obj: object, method: str, into: list[float], sync: Callable[[], None] | None = None
) -> None:
    """Wrap `obj.method` so each call's wall time is appended to `into`; `sync` (for example
    `torch.cuda.synchronize`) is called before reading the clock at both ends, so that queued
    GPU work counts in the call that queued it."""
    inner = getattr(obj, method)

    def wrapper(*args, **kwargs):
        if sync:
            sync()
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            if sync:
                sync()
            into.append(time.perf_counter() - start)

    setattr(obj, method, wrapper)


class StepTimes:
    """Wall time from TRL's on_step_begin to on_step_end: generation, rewards, the reference
    forward and every microbatch's forward/backward up to the optimizer step; `sync` as in
    `timed`."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.seconds: list[float] = []
        self._start = 0.0
        self._sync = sync

    def _now(self) -> float:
        if self._sync:
            self._sync()
        return time.perf_counter()

    def callback(self, base: type) -> Any:
        """An instance of a `base` (transformers' `TrainerCallback`) subclass recording times."""
        times = self

        class Callback(base):
            def on_step_begin(self, args, state, control, **kwargs):
                times._start = times._now()

            def on_step_end(self, args, state, control, **kwargs):
                times.seconds.append(times._now() - times._start)

        return Callback()


def train_trl_timed(
    args: Any,
    model_dir: str,
    reward_funcs: list[Callable],
    dataset: Any,
    tokenizer: Any,
    sync: Callable[[], None] | None = None,
) -> tuple[Any, dict[str, list[float]], StepTimes]:
    """Build TRL's GRPOTrainer, time its phases (`generate`: each generation call, `reward`:
    each reward call, `prepare`: generation + rewards + reference forward) and its steps, and
    train. Returns (trainer, phase seconds, step times); `sync` as in `timed`."""
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    phases: dict[str, list[float]] = {"generate": [], "reward": [], "prepare": []}
    timed(trainer, "_generate_single_turn", phases["generate"], sync)
    timed(trainer, "_calculate_rewards", phases["reward"], sync)
    timed(trainer, "_generate_and_score_completions", phases["prepare"], sync)
    steps = StepTimes(sync)
    trainer.add_callback(steps.callback(TrainerCallback))
    trainer.train()
    return trainer, phases, steps


def trl_phases(
    seconds: list[float],
    prepare: list[float],
    generate: list[float],
    reward: list[float],
    generation_name: str = "generate",
) -> dict[str, list[float]]:
    """Per-step seconds of TRL's phases from `train_trl_timed`'s timings: generation, reward,
    the reference forward (the rest of its preparation: no old-logprob pass at mu = 1, with its
    tokenising and advantage bookkeeping) and train (the rest of the step)."""
    return {
        generation_name: generate,
        "reward": reward,
        "reference": [p - g - r for p, g, r in zip(prepare, generate, reward, strict=True)],
        "train": [s - p for s, p in zip(seconds, prepare, strict=True)],
    }
