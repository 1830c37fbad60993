"""Peak memory of GRPO against PPO (`grpo_vs_ppo.py`): a CPU peak split into the runtime
(measured), the model states (from the parameter count) and the rest; as a section states it."""

from __future__ import annotations

import subprocess
import sys

from harness.checkout import checkout_env
from harness.comparison import met
from harness.tables import markdown_table


def runtime_floor(model_dir: str) -> float:
    """Peak RSS in MB of a process importing oncurve's trainer and building `model_dir`'s model
    on the meta device: the fixed cost in every run's peak (the model code imports much more)."""
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


def parameter_count(model_dir: str) -> int:
    """The parameter count of `model_dir`'s model, built on the meta device (no weights)."""
    import torch
    import transformers

    with torch.device("meta"):
        config = transformers.AutoConfig.from_pretrained(model_dir)
        return transformers.AutoModelForCausalLM.from_config(config).num_parameters()


def breakdown(params: int, beta: float, floor: float, peaks: dict[str, tuple[float, bool]]) -> str:
    """Each trainer's peak (`peaks`: label -> (MB, trains a critic)) split into `floor`, model
    states of `params` parameters and the rest, and the first two's ratio without activations."""
    size = params * 4 / 2**20  # MB of one fp32 copy; the critic (trunk + scalar head, tied
    # embeddings) has the policy's count to within its head
    reference = size if beta > 0 else 0.0

    def states(critic: bool) -> list[float]:
        # gradients are freed after each optimizer step, so one model's exist at a time
        return [3 * size, reference, 3 * size if critic else 0.0, size]

    rows = [
        [label]
        + [f"{x:,.0f}" for x in (rss, floor, *states(critic), rss - floor - sum(states(critic)))]
        for label, (rss, critic) in peaks.items()
    ]
    first, second = (floor + sum(states(critic)) for _, critic in peaks.values())
    header = ["trainer", "peak RSS", "runtime", "policy + AdamW", "reference", "critic + AdamW"]
    return (
        "Where the peak comes from (MB; states computed from parameter counts, runtime measured "
        "as the peak RSS of a process that imports torch, transformers and oncurve and builds "
        "the model class without weights; the rest is activations, logits, the rollout's cache "
        f"and allocator slack):\n\n{markdown_table([*header, 'gradients', 'rest'], rows)}"
        "\n\nWith no activations in either trainer the ratio would be (runtime + "
        f"{list(peaks)[0]}'s states) / (runtime + {list(peaks)[1]}'s states) = "
        f"**{first / second:.3f}x**; the measured ratio differs from it by the two rests (the "
        "critic's own forward and backward and the allocator slack around them)."
    )


def peak_notes(row: dict, target: float, held: bool) -> tuple[str, str | None]:
    """GRPO's peak against PPO's as a section states it: a sentence (GPU against the 25-50%
    claim, else RSS against `target` if `held`) and, with a "floor", the `breakdown` (else None)."""
    grpo, ppo = row["trainers"]["GRPO"], row["trainers"]["PPO"]
    memory = grpo["rss"] / ppo["rss"]
    if ppo["cuda"] is not None:
        verdict = (f"Peak GPU memory (`torch.cuda.max_memory_allocated`): GRPO "
                   f"**{grpo['cuda'] / ppo['cuda']:.3f}x** PPO's (the claim: 25-50% less, "
                   f"0.50-0.75x); peak RSS {memory:.3f}x.")  # fmt: skip
    else:
        verdict = (f"Peak memory (process peak RSS, runtime included): GRPO **{memory:.3f}x** "
                   f"PPO's; " + (f"target <= {target}x: **{met(memory, target)}**." if held else
                   f"reported only (the {target}x target is for the ~30M model)."))  # fmt: skip
    if row["floor"] is None:
        return verdict, None
    peaks = {"GRPO": (grpo["rss"], False), "PPO": (ppo["rss"], True)}
    return verdict, breakdown(row["params"], row["settings"]["algo.beta"], row["floor"], peaks)
