"""The supervised recipe behind the bundled model (`oncurve warmstart`).

A Qwen2-style model of about 0.8M parameters, built from a config with the character-level
tokenizer, learns `arith` from reference scratchpads (prompt + solution + EOS, loss on the
completion only) and is stopped early on purpose: it always writes the right format and
mostly the right procedure, but misreads digits and carries often enough that greedy accuracy
on the test split sits in the 20-50% band. That leaves the headroom that GRPO then closes
with reward alone. Everything is seeded, so the same command rebuilds the same weights on the
same machine, torch build and thread count (float sums are ordered by them), into a new
directory that then replaces the bundled one:

    oncurve warmstart --out NEW_DIR --steps 350 --seed 0
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from oncurve.data.tasks.arith import ArithTask
from oncurve.errors import UserError
from oncurve.model.char_tokenizer import char_tokenizer
from oncurve.run.durable_files import follow_umask

DEFAULT_STEPS = 350
DEFAULT_SEED = 0
MAX_NEW_TOKENS = 64  # the trainer's default rollout length, also used for the accuracy check


@dataclass
class WarmstartResult:
    """What a warm-start run measured: the per-step training loss (mean over completion tokens)
    and the greedy accuracy of the saved model on `eval_prompts` test problems."""

    losses: list[float]
    accuracy: float
    seconds: float


def model_config(
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
) -> Qwen2Config:
    """A small Qwen2 config over the tokenizer's vocabulary. RoPE base 10k rather than Qwen2's
    1M: sequences here are under 64 tokens, and the faster rotations resolve digit positions."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=256,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def encode_sft(
    tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, str]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `<bos> prompt solution <eos>` sequences.

    Returns:
        input_ids [N, L], attention_mask [N, L], labels [N, L] (the input ids on completion
        tokens including EOS, -100 on the prompt and padding, so the loss is on the completion).
    """
    sequences, prompt_lens = [], []
    for row in rows:
        prompt = tokenizer(row["prompt"])["input_ids"]  # with <bos>, as the trainer encodes it
        completion = tokenizer(row["solution"], add_special_tokens=False)["input_ids"]
        sequences.append(prompt + completion + [tokenizer.eos_token_id])
        prompt_lens.append(len(prompt))
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (seq, p) in enumerate(zip(sequences, prompt_lens, strict=True)):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention_mask[i, : len(seq)] = 1
        labels[i, p : len(seq)] = input_ids[i, p : len(seq)]
    return input_ids, attention_mask, labels


@torch.no_grad()
def greedy_completions(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_new_tokens: int = MAX_NEW_TOKENS,
    batch_size: int = 256,
) -> list[str]:
    """Greedy completions (`model.generate`, left padding), decoded without special tokens."""
    tokenizer.padding_side = "left"
    texts = []
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[start : start + batch_size], padding=True, return_tensors="pt")
        batch = batch.to(model.device)
        out = model.generate(
            **batch,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        texts += tokenizer.batch_decode(
            out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
        )
    return texts


def greedy_accuracy(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, str]]
) -> float:
    """Fraction of `rows` whose greedy completion earns arith's "correct" reward (the same at
    any number of digits)."""
    texts = greedy_completions(model, tokenizer, [r["prompt"] for r in rows])
    correct = ArithTask().reward_fns()["correct"]
    scores = correct([r["prompt"] for r in rows], texts, answer=[r["answer"] for r in rows])
    return sum(scores) / len(rows)


def warmstart(
    out_dir: Path,
    steps: int | None = None,
    seed: int = DEFAULT_SEED,
    *,
    batch_size: int = 64,
    lr: float = 1e-3,
    warmup_steps: int = 50,
    hidden_size: int = 128,
    num_layers: int = 4,
    intermediate_size: int = 384,
    max_digits: int = 4,
    eval_prompts: int = 500,
    device: str = "cpu",
    stop_at: float | None = None,
    check_every: int = 50,
    log: Callable[[str], None] = print,
) -> WarmstartResult:
    """Train the warm-start model on arith's train split and save it to `out_dir` as a
    Hugging Face model directory (config, safetensors weights, generation config, tokenizer,
    README card with the command and the measured test accuracy).

    `steps` defaults to DEFAULT_STEPS, the stopping point of the bundled model; each step is
    one AdamW update on `batch_size` fresh problems (no problem is seen twice), with a linear
    warmup then a constant `lr`. The model sizes exist so a test can run the recipe in seconds,
    and a benchmark a larger model on longer sums (arith's `max_digits`) on `device`.

    With `stop_at`, `steps` is a bound: every `check_every` steps the model's greedy accuracy
    on `eval_prompts` train-split problems of another seed (the test problems stay unseen) is
    checked, and training stops at the first check at `stop_at` or above, so that a model whose
    learning speed is not known beforehand still leaves GRPO its headroom.
    """
    steps = DEFAULT_STEPS if steps is None else steps
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UserError(f"warmstart: {out_dir} exists and is not an empty directory")
    existing = next(p for p in out_dir.absolute().parents if p.exists())
    if not out_dir.exists() and not existing.is_dir():
        raise UserError(f"warmstart: {existing} is a file: no directory {out_dir} can be made")
    if steps < 1:
        raise ValueError(f"warmstart: steps must be at least 1, got {steps}")
    if eval_prompts < 1:
        raise ValueError(f"warmstart: eval_prompts must be at least 1, got {eval_prompts}")
    started = time.perf_counter()
    torch.manual_seed(seed)
    tokenizer = char_tokenizer()
    config = model_config(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        intermediate_size=intermediate_size,
    )
    model = Qwen2ForCausalLM(config).to(device)
    task = ArithTask(max_digits)
    train_rows = task.examples("train", steps * batch_size, seed)
    test_rows = task.examples("test", eval_prompts, seed)
    check_rows = task.examples("train", eval_prompts, seed + 1) if stop_at is not None else []
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(1, warmup_steps))
    )

    model.train()
    losses = []
    for step in range(steps):
        input_ids, attention_mask, labels = encode_sft(
            tokenizer, train_rows[step * batch_size : (step + 1) * batch_size]
        )
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
        loss = model(**{name: value.to(device) for name, value in batch.items()}).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if (step + 1) % 100 == 0 or step + 1 == steps:
            log(f"warmstart step {step + 1}/{steps} loss {losses[-1]:.4f}")
        if check_rows and (step + 1) % check_every == 0 and step + 1 < steps:
            model.eval()
            checked = greedy_accuracy(model, tokenizer, check_rows)
            model.train()
            log(f"warmstart step {step + 1}: accuracy {checked:.3f} on the check problems")
            if checked >= stop_at:
                break

    model.eval()
    accuracy = greedy_accuracy(model, tokenizer, test_rows)
    seconds = time.perf_counter() - started
    log(f"warmstart greedy accuracy on {eval_prompts} test problems: {accuracy:.3f}")

    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False,
    )
    # written beside it, then linked into place file by file: a link never replaces a file,
    # so a directory another writer filled meanwhile keeps its files (and its own mode)
    target = out_dir.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    written = target.parent / f".{target.name}.{os.getpid()}.partial"
    shutil.rmtree(written, ignore_errors=True)  # an earlier process's of this number, crashed
    written.mkdir()
    model.save_pretrained(written, safe_serialization=True)
    tokenizer.save_pretrained(written)
    recipe = {
        "steps": len(losses),
        "seed": seed,
        "batch_size": batch_size,
        "lr": lr,
        "warmup_steps": warmup_steps,
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": losses[-1],
        "test_accuracy": accuracy,
        "test_prompts": eval_prompts,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "intermediate_size": intermediate_size,
        "max_digits": max_digits,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    (written / "README.md").write_text(_card(recipe))
    follow_umask(written)
    target.mkdir(exist_ok=True)
    try:
        if any(target.iterdir()):
            raise FileExistsError
        for path in sorted(written.iterdir()):
            os.link(path, target / path.name)
    except FileExistsError:
        raise UserError(
            f"warmstart: {out_dir} was written meanwhile by something else, and is kept; this "
            f"run's model is in {written}"
        ) from None
    shutil.rmtree(written)
    return WarmstartResult(losses=losses, accuracy=accuracy, seconds=seconds)


def _card(recipe: dict) -> str:
    return f"""# oncurve bundled default model

A {recipe["parameters"] / 1e6:.2f}M-parameter Qwen2-style causal LM with a character-level
tokenizer, trained by supervised learning on the `arith` task's scratchpad solutions and stopped
early on purpose, so that GRPO (`oncurve train`) has room to raise its accuracy.

Rebuilt, on the same machine, torch and thread count, by `oncurve.warmstart.warmstart` with the
settings of the recipe below; with the bundled sizes, by:

    oncurve warmstart --out NEW_DIR --steps {recipe["steps"]} --seed {recipe["seed"]}

Measured at save time: greedy accuracy {recipe["test_accuracy"]:.3f} on {recipe["test_prompts"]}
`arith` test problems (seed {recipe["seed"]}), final training loss {recipe["final_loss"]:.4f}.

Trained by GRPO with the settings `model.path=default` gives the bundled model (its context has
room for 64 new tokens; the field defaults are a real pretrained model's):

    oncurve train model.path=THIS_DIR rollout.max_new_tokens=64 optim.lr=1e-4 eval.num_prompts=500

Recipe: {json.dumps(recipe)}
"""
