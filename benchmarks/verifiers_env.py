"""SmolLM2-135M-Instruct trained on 2 CPU cores on a multi-turn verifiers environment, through
oncurve's endpoint (`rollout.env=verifiers:environments.sums_second_chance`: the `sums`
problems with a second turn after a wrong answer, scored 1 / 0.75 / 0): held-out success (greedy,
a score above 0.5: right within two turns) before and after, first-try and solved rates of the
sampled episodes, the episodes played and the wall time. First, the same environment played
in-process (oncurve's own protocol, `SecondChance`) and through the endpoint by verifiers'
rollout code, greedy on the held-out problems: the episodes' tokens compared one for one.

    make smollm2                                        # once: fetch and import the model
    .venv/bin/python benchmarks/verifiers_env.py        # about 15 minutes on a quiet machine
"""

from __future__ import annotations

import argparse
from typing import Any

from harness import learning
from harness.checkout import CACHE, ROOT
from harness.children import setting_args
from harness.machine import load_note
from harness.tables import markdown_table, publish

NAME = "verifiers_env"
ENV = "verifiers:environments.sums_second_chance"
MODEL = ROOT / "models" / "smollm2-135m-instruct"
# the smollm2 recipe's job (configs/smollm2_135m.yaml) on the environment: two turns of 32 tokens
JOB = {
    "model.path": str(MODEL), "data.chat_template": True, "rollout.env": ENV,
    "rollout.max_turns": 2, "rollout.max_new_tokens": 32, "rollout.max_observation_tokens": 32,
    "data.prompts_per_step": 8, "rollout.group_size": 8, "algo.beta": 0.0, "optim.lr": 2e-5,
    "optim.warmup_steps": 3, "optim.schedule": "cosine", "eval.every": 5, "run.seed": 0,
}  # fmt: skip


def same_tokens(count: int) -> tuple[int, int]:
    """Of `count` held-out problems played greedy in-process and through the endpoint by
    verifiers, how many episodes have the same tokens (prompt, turns and observations)."""
    from environments.sums_second_chance import SecondChance

    from oncurve.config import load_config
    from oncurve.data.prompts import encode_prompt
    from oncurve.envs.verifiers_envs import GroupPlay, environment_rows, load_environment
    from oncurve.model.sources import load_model, load_tokenizer
    from oncurve.rollout import SamplingParams, TorchSampler
    from oncurve.rollout.episodes import EpisodeSettings, ObservationFormat, run_episodes
    from oncurve.rollout.harness import HarnessSettings, play_harness

    data = load_config(None, [f"model.path={MODEL}", "data.chat_template=true"]).data
    tokenizer = load_tokenizer(MODEL)
    sampler = TorchSampler(load_model(MODEL), tokenizer)
    rows = environment_rows(ENV, {}, "eval")[:count]
    for row in rows:
        messages = row["prompt_messages"]
        row["prompt_ids"] = encode_prompt(tokenizer, row["prompt"], data, "", messages=messages)
    params = SamplingParams(max_new_tokens=JOB["rollout.max_new_tokens"], temperature=0.0)
    observed = JOB["rollout.max_observation_tokens"]
    in_process = run_episodes(sampler, rows, 1, params, EpisodeSettings(
        SecondChance, 2, lambda text: encode_prompt(tokenizer, text, data, ""),
        ObservationFormat(tokenizer, True, observed, role="user"),
    )).rollout  # fmt: skip
    harness = HarnessSettings(GroupPlay(load_environment(ENV, {}), 2), 2, observed, groups=True)
    through, _ = play_harness(sampler, rows, 1, params, harness)

    def tokens(rollout: Any, i: int) -> list[int]:
        return rollout.input_ids[i][rollout.attention_mask[i].bool()].tolist()

    return sum(tokens(in_process, i) == tokens(through, i) for i in range(count)), count


def section(row: dict[str, Any]) -> str:
    """The page: the job, the token comparison, and the table of the run."""
    same, count = row["same_tokens"]
    evals = ", ".join(f"step {s} ({t:.0f} s) {a:.1%}" for s, t, a in row["evals"])
    table = markdown_table(
        ["steps", "episodes", "s/step (median)", "wall min", "held-out before", "after",
         "first try (sampled), first / last step", "solved (sampled), first / last step"],
        [[str(row["steps"]), str(row["episodes"]), f"{row['s_per_step']:.1f}",
          f"{row['wall_s'] / 60:.1f}", f"{row['before']:.1%}", f"{row['after']:.1%}",
          f"{row['first_try'][0]:.1%} / {row['first_try'][-1]:.1%}",
          f"{row['solved'][0]:.1%} / {row['solved'][-1]:.1%}"]],
    )  # fmt: skip
    return (
        f"Written by `{row['command']}` on {row['date']} at {row['commit']}: {row['job']}. "
        f"{row['load_note']}\n\nSame tokens in-process and through the endpoint (greedy, "
        f"held-out problems): **{same} of {count}** episodes.\n\n{table}\n\nHeld-out success "
        f"(greedy, right within two turns) during training: {evals}.\n"
    )


def summary(row: dict[str, Any]) -> str:
    """One line for the tables of figures."""
    return (
        f"SmolLM2-135M on a two-turn verifiers environment, CPU: held-out success "
        f"{row['before']:.1%} -> {row['after']:.1%} in {row['steps']} steps "
        f"({row['episodes']} episodes, {row['wall_s'] / 60:.1f} min)"
    )


def headline(row: dict[str, Any]) -> dict[str, str]:
    """The README's row for training on an environment of the ecosystem."""
    same, count = row["same_tokens"]
    figure = (
        f"SmolLM2-135M-Instruct on a two-turn verifiers environment: held-out success "
        f"{row['before']:.0%} -> {row['after']:.0%} in {row['steps']} steps "
        f"({row['wall_s'] / 60:.0f} min); {same} of {count} episodes the same tokens "
        f"in-process and through the endpoint"
    )
    return {"area": "a multi-turn environment, 2 CPU cores", "figure": figure,
            "command": "benchmarks/verifiers_env.py"}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--compare", type=int, default=50, help="held-out problems compared")
    args = parser.parse_args()
    learning.require(MODEL)
    same = same_tokens(args.compare)
    print(f"same tokens in-process and through the endpoint: {same[0]} of {same[1]}")
    overrides = setting_args({**JOB, "run.steps": args.steps})
    run = learning.train(overrides, CACHE / NAME, "env", ("env/first_try", "env/solved"))
    job = f"{args.steps} steps of 8 prompts x G=8, two turns of 32 tokens, lr 2e-5 (cosine), beta 0"
    publish(NAME, "SmolLM2-135M-Instruct on a multi-turn verifiers environment, 2 CPU cores", "", {
        "renderer": NAME, "job": job, "load_note": load_note(), "same_tokens": list(same),
        "steps": args.steps, "episodes": args.steps * 8 * 8, "wall_s": run["wall_s"],
        "s_per_step": run["s_per_step"], "before": run["evals"][0][2],
        "after": run["evals"][-1][2], "evals": run["evals"], "first_try": run["env/first_try"],
        "solved": run["env/solved"],
    })  # fmt: skip


if __name__ == "__main__":
    main()
