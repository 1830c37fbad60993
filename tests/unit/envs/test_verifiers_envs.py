"""verifiers environments train as they are (`rollout.env: verifiers:NAME`): the environment's
dataset is the prompts, its rollouts play against the endpoint token for token, its rubric
scores each group together, and its parts are logged as `env/<name>`."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import pytest
from helpers.configs import make_config
from helpers.episodes import (
    SlowSampler,
    load_qwen3_tokenizer,
    replier_sampler,
    tool_user_sampler,
)
from helpers.models import tiny_qwen2
from helpers.runs import metric_rows
from helpers.vf_environments import FOLLOW_UP, QUESTIONS

import oncurve
from oncurve.cli import main
from oncurve.config import load_config
from oncurve.config.loading import config_yaml
from oncurve.data.prompts import load_prompts
from oncurve.envs.verifiers_envs import GroupPlay, environment_rows, load_environment
from oncurve.errors import UserError
from oncurve.loop.trainer import train
from oncurve.rollout import SamplingParams, TorchSampler
from oncurve.rollout.env_calls import DONE, ERROR, LENGTH, MAX_TURNS, EnvFaults
from oncurve.rollout.harness import HarnessSettings, play_harness

pytest.importorskip("verifiers", reason="the verifiers extra is not installed")
SINGLE = "verifiers:helpers.vf_environments"


@pytest.fixture(scope="module")
def sampler() -> TorchSampler:
    tokenizer = load_qwen3_tokenizer()
    model = tiny_qwen2(len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.max_position_embeddings = 4096
    return TorchSampler(model, tokenizer)


def play(sampler, kind: str, faults: EnvFaults | None = None, max_new_tokens: int = 6, max_turns=2):
    env_args = {"kind": kind}
    rows = environment_rows(SINGLE, env_args, "train")[:2]
    for row in rows:
        row["prompt_ids"] = sampler.tokenizer.apply_chat_template(
            row["prompt_messages"], add_generation_prompt=True, tokenize=True, return_dict=False
        )
    play = GroupPlay(load_environment(SINGLE, env_args), max_turns)
    settings = HarnessSettings(play, max_turns, 64, faults or EnvFaults(), groups=True)
    params = SamplingParams(max_new_tokens=max_new_tokens, seed=3)
    return rows, *play_harness(sampler, rows, 3, params, settings)


def answers(cut: str | None = None):
    """A reply for `replier_sampler`: "3" to a question, "7" to the environment's follow-up,
    and to the question `cut` a run of "3"s that the token limit cuts."""

    def reply(text: str) -> tuple[str, bool]:
        last = text.split("<|im_start|>user")[-1]
        if FOLLOW_UP in last:
            return "7", True
        return (" 3" * 40, False) if cut and cut in last else ("3", True)

    return reply


def test_the_environment_s_dataset_is_the_prompts():
    train_rows = environment_rows(SINGLE, {"eval_rows": 2}, "train")
    held_out = environment_rows(SINGLE, {"eval_rows": 2}, "eval")
    assert [r["prompt"] for r in train_rows] == [q["question"] for q in QUESTIONS]
    assert [r["answer"] for r in held_out] == ["3", "7"]
    assert [m["role"] for m in train_rows[0]["prompt_messages"]] == ["system", "user"]
    assert environment_rows(SINGLE, {}, "eval") == []  # no eval dataset: no held-out rows


def test_a_group_is_scored_by_the_rubric_on_the_tokens_the_policy_sampled(sampler):
    rows, rollout, columns = play(sampler, "single")
    tok = sampler.tokenizer
    assert columns["episode_fault"] == [None] * 6 and columns["turns"] == [1] * 6
    for i, metrics in enumerate(columns["episode_metrics"]):
        # the rubric's weights: has_answer 1, longest_in_group 0.5
        expected = metrics["has_answer"] + 0.5 * metrics["longest_in_group"]
        assert columns["episode_reward"][i] == pytest.approx(expected)
    for g in range(2):  # the group-wise part saw the group: its longest answer is paid
        group = columns["episode_metrics"][3 * g : 3 * g + 3]
        assert max(m["longest_in_group"] for m in group) == 1.0
        prompt = rollout.prompt_ids[3 * g][rollout.prompt_mask[3 * g].bool()].tolist()
        assert prompt == list(rows[g]["prompt_ids"])
    sampled = rollout.loss_mask.bool()
    assert bool(sampled.any()) and bool((rollout.logprobs[sampled] < 0).all())
    assert int(rollout.tool_mask.sum()) == 0  # one turn: nothing fed
    assert tok.decode(rollout.completion_ids[0][sampled[0]]) == rollout.texts[0]


def test_a_multi_turn_environment_s_answers_are_fed_out_of_the_loss():
    sampler = replier_sampler(load_qwen3_tokenizer(), answers())
    _, rollout, columns = play(sampler, "multi")
    assert columns["turns"] == [2] * 6
    assert all(m["num_turns"] == 2.0 for m in columns["episode_metrics"])
    for i in range(6):
        width = int(rollout.completion_mask[i].sum())
        fed = rollout.completion_ids[i][:width][rollout.tool_mask[i][:width].bool()]
        assert FOLLOW_UP in sampler.tokenizer.decode(fed)
        assert not bool((rollout.loss_mask[i][:width] & rollout.tool_mask[i][:width]).any())


def test_an_episode_the_environment_failed_gets_the_error_policy():
    """verifiers records the environment's own error (its infrastructure down) in the
    episode's state: the episode is dropped, or the run stops, as `reward.errors` says."""
    sampler = replier_sampler(load_qwen3_tokenizer(), answers())
    _, rollout, columns = play(sampler, "down", EnvFaults(on_error="none"))
    assert columns["episode_fault"] == [ERROR] * 6  # every episode reaches the failing turn
    assert all(math.isnan(r) for r in columns["episode_reward"])
    assert int(rollout.loss_mask.sum()) == 0
    with pytest.raises(UserError, match=r"verifiers: the tool server is down"):
        play(sampler, "down")  # reward.errors=raise, the default


def test_the_time_limit_leaves_out_the_time_verifiers_waits_on_the_sampler():
    """Two turns whose sampler calls each take over half a second play out under
    `rollout.env_timeout_s` of 0.4 s: the limit is the environment's time."""
    slow = replier_sampler(load_qwen3_tokenizer(), answers(), SlowSampler)
    _, _, columns = play(slow, "multi", EnvFaults(timeout_s=0.4))
    assert columns["episode_fault"] == [None] * 6 and columns["turns"] == [2] * 6


def test_a_prompt_longer_than_the_context_is_verifiers_overlong_prompt():
    """The endpoint's answer to a prompt past the model's context is one verifiers reads as
    an overlong prompt: the rollout ends there, truncated (`length`, as an in-process episode
    that outgrows its room), and the rubric scores it (an episode that grew too long is no
    failure of the environment's, so `reward.errors=raise` does not stop the run)."""
    _, _, columns = play(replier_sampler(load_qwen3_tokenizer(), answers()), "long")
    assert columns["episode_fault"] == [None] * 6 and columns["turns"] == [1] * 6
    assert columns["episode_end"] == [LENGTH] * 6
    # the rubric scored the first turn, "3": right for 1+2=, not for 3+4=
    assert columns["episode_reward"] == [1.5] * 3 + [0.5] * 3


@pytest.mark.parametrize(
    ("kind", "cut", "max_turns", "ends", "turns"),
    [
        ("single", None, 2, [DONE] * 6, [1] * 6),
        ("single", "1+2=", 2, [LENGTH] * 3 + [DONE] * 3, [1] * 6),
        ("multi", None, 2, [MAX_TURNS] * 6, [2] * 6),
        ("multi", "1+2=", 2, [LENGTH] * 3 + [MAX_TURNS] * 3, [1] * 3 + [2] * 3),
        ("multi", None, 1, [MAX_TURNS] * 6, [1] * 6),
        ("multi", "1+2=", 1, [LENGTH] * 3 + [MAX_TURNS] * 3, [1] * 6),
        ("tools", None, 3, [DONE] * 6, [2] * 6),
    ],
)
def test_an_episode_ends_as_verifiers_ended_it(kind, cut, max_turns, ends, turns):
    """verifiers' turn limit, or `rollout.max_turns` where it is lower, is `max_turns` (a
    single-turn environment's one turn is its whole episode: `done`), its truncated rollouts
    `length`, and a turn cut at `max_new_tokens` ends the episode there, as it ends an
    in-process one: the environment never answers it."""
    tokenizer = load_qwen3_tokenizer()
    sampler = (
        tool_user_sampler(tokenizer)
        if kind == "tools"
        else replier_sampler(tokenizer, answers(cut))
    )
    max_new_tokens = 40 if kind == "tools" else 8
    _, rollout, columns = play(sampler, kind, max_new_tokens=max_new_tokens, max_turns=max_turns)
    assert columns["episode_fault"] == [None] * 6
    assert columns["episode_end"] == ends and columns["turns"] == turns
    if cut:  # the rubric scored the cut turn, its "3"s (has_answer: 1+2=3)
        assert [m["has_answer"] for m in columns["episode_metrics"][:3]] == [1.0] * 3
        fed = rollout.completion_ids[0][rollout.tool_mask[0].bool()]
        assert FOLLOW_UP not in tokenizer.decode(fed)


class FakeEnvironment:
    """An environment whose rollouts end in the given states; its rubric pays 1."""

    def __init__(self, states: list[dict]) -> None:
        self.states = iter(states)
        self.rubric = self

    async def rollout(self, *args) -> dict:
        return next(self.states)

    async def score_group(self, states: list[dict]) -> None:
        for state in states:
            state["reward"] = 1.0


def test_only_the_policys_own_faults_are_scored():
    """An empty or malformed answer or a tool call that does not parse is the policy's to
    learn (the rubric scores it); a failed model call (the endpoint down, refused, timed out)
    and verifiers' own rollout timeout are faults, never a score."""
    import asyncio

    import verifiers as vf

    down = vf.errors.ModelError()
    down.__cause__ = ConnectionError("connection refused")
    states = [
        {"error": vf.errors.EmptyModelResponseError()},
        {"error": vf.errors.ToolParseError()},
        {"error": down},
        {"timed_out": True},
        {},
    ]
    played = asyncio.run(
        GroupPlay(FakeEnvironment(states), 2)([None] * 5, "m", {"verifiers_input": {}})
    )
    assert played[0] == played[1] == played[4] == {"reward": 1.0, "episode_end": DONE}
    assert isinstance(played[2], RuntimeError) and "ModelError" in str(played[2])
    assert isinstance(played[3], TimeoutError)


def test_a_run_trains_on_a_verifiers_environment(chat_model_dir, data_file, tmp_path):
    config = make_config(
        chat_model_dir, data_file, tmp_path / "run", "data.path=null", f"rollout.env={SINGLE}",
        "rollout.env_args={kind: multi, eval_rows: 2}", "rollout.max_turns=2",
        "rollout.max_observation_tokens=32", "data.chat_template=true", "reward.functions=[]",
        "run.steps=1", "eval.at_start_end=true",
    )  # fmt: skip
    train(config, quiet=True)
    before, row, after = metric_rows(tmp_path / "run")
    assert before["eval/accuracy"] == after["eval/accuracy"] == 0.0  # on its 2 eval rows
    # a cut turn or an empty answer ends an episode, else the environment asks again: how many
    # turns a random model's episodes play is the sampling's (turns are held with scripted
    # replies in test_an_episode_ends_as_verifiers_ended_it)
    assert 1.0 <= row["episode/turns_mean"] <= 2.0 and row["episode/errors"] == 0.0
    assert 1.0 <= row["env/num_turns"] <= 2.0 and 0.0 <= row["env/has_answer"] <= 1.0
    expected = row["env/has_answer"] + 0.5 * row["env/longest_in_group"]
    assert row["reward/env"] == pytest.approx(expected)


def test_a_tool_environment_runs_the_calls_the_policy_makes():
    """A ToolEnv: the model is shown its tools, its Hermes call runs the tool, the result is
    fed (out of the loss) and the answer after it is the rubric's to score."""
    tokenizer = load_qwen3_tokenizer()
    _, rollout, columns = play(tool_user_sampler(tokenizer), "tools", max_new_tokens=40)
    assert columns["episode_fault"] == [None] * 6 and columns["turns"] == [2] * 6
    assert all(m["has_answer"] == 1.0 for m in columns["episode_metrics"])  # 1+2=3, 3+4=7
    first = rollout.prompt_ids[0][rollout.prompt_mask[0].bool()].tolist()
    assert '"name": "add"' in tokenizer.decode(first)  # the tool's schema, in the prompt
    width = int(rollout.completion_mask[0].sum())
    fed = rollout.completion_ids[0][:width][rollout.tool_mask[0][:width].bool()]
    assert "<tool_response>\n3\n</tool_response>" in tokenizer.decode(fed)
    sampled = rollout.completion_ids[0][:width][rollout.loss_mask[0][:width].bool()]
    assert tokenizer.decode(sampled).startswith('<tool_call>\n{"name": "add"')


def test_a_tool_environments_rows_are_planned_with_their_tools_schema():
    """The prompt the endpoint renders for a ToolEnv shows its tools: the rows' token counts,
    which size the memory plan and the context checks, include them."""
    from oncurve.config import DataConfig
    from oncurve.data.prompts import PromptData

    tokenizer = load_qwen3_tokenizer()
    rows = environment_rows(SINGLE, {"kind": "tools"}, "train")
    assert rows[0]["prompt_tools"][0]["function"]["name"] == "add"
    (row,) = PromptData(rows[:1], tokenizer, DataConfig(chat_template=True), seed=0).rows
    assert '"name": "add"' in tokenizer.decode(row["prompt_ids"])


def test_a_missing_extra_or_environment_is_one_line(monkeypatch):
    with pytest.raises(UserError, match=r"^rollout.env verifiers:no_such_env: Could not import"):
        load_environment("verifiers:no_such_env", {})
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(UserError, match=r"pip install 'oncurve\[verifiers\]'$"):
        load_environment("verifiers:other", {})


ENVIRONMENT_MODULES = {
    "vf_needs_a_key": """
def load_environment(**env_args):
    raise RuntimeError("needs an API key for the judge")
""",
    "vf_buggy_loader": """
def load_environment(level=1):
    return len(level)  # a TypeError of the environment's own code, not of its arguments
""",
    "vf_no_role": """
def load_environment():
    import verifiers as vf
    from datasets import Dataset
    rows = [{"prompt": [{"role": "user", "content": "2+2="}], "answer": "4"},
            {"prompt": [{"content": "1+1="}], "answer": "2"}]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[]))
""",
}


@pytest.fixture
def environment_modules(tmp_path, monkeypatch) -> None:
    for name, source in ENVIRONMENT_MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize(
    ("spec", "env_args", "line"),
    [
        (SINGLE, {"difficulty": "easy"},
         f"rollout.env_args do not fit rollout.env {SINGLE}: load_environment() got an "
         "unexpected keyword argument 'difficulty'"),
        ("verifiers:vf_needs_a_key", {},
         "rollout.env verifiers:vf_needs_a_key: its load_environment raised RuntimeError: "
         "needs an API key for the judge"),
        ("verifiers:vf_buggy_loader", {"level": 2},
         "rollout.env verifiers:vf_buggy_loader: its load_environment raised TypeError: "
         "object of type 'int' has no len()"),
    ],
)  # fmt: skip
def test_an_environment_that_does_not_load_is_one_line(environment_modules, spec, env_args, line):
    """verifiers wraps what `load_environment` raised in a RuntimeError: the line names the
    setting at fault and the cause, and calls the arguments wrong only when the loader's
    signature does not take them."""
    with pytest.raises(UserError) as raised:
        load_environment(spec, env_args)
    assert str(raised.value) == line


def test_a_prompt_message_without_a_role_is_one_line_naming_its_row(environment_modules):
    with pytest.raises(UserError) as raised:
        environment_rows("verifiers:vf_no_role", {}, "train")
    assert str(raised.value) == (
        "rollout.env verifiers:vf_no_role train row 1: a message of its prompt has no role"
    )


def test_a_data_file_beside_the_environment_s_dataset_is_refused(
    tiny_model_dir, data_file, tmp_path
):
    config = make_config(tiny_model_dir, data_file, tmp_path / "run", f"rollout.env={SINGLE}")
    with pytest.raises(UserError, match=r"^data.path: rollout.env verifiers:\S+ trains on its own"):
        load_prompts(config)


def test_eval_of_a_run_on_an_environment_without_an_eval_dataset_is_one_line(tmp_path, capsys):
    """`oncurve eval --run` takes a verifiers environment's run's held-out rows from the
    environment's eval dataset; one that has none says so, and what to give instead."""
    run = tmp_path / "run"
    run.mkdir()
    env = "verifiers:helpers.vf_environments"
    config = load_config(None, ["model.path=default", f"rollout.env={env}", f"run.dir={run}"])
    (run / "config.yaml").write_text(config_yaml(config))
    shutil.copytree(Path(oncurve.__file__).parent / "assets" / "default", run / "final")
    assert main(["eval", "--run", str(run), "--device", "cpu", "--max-new-tokens", "4"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"oncurve: error: rollout.env {env} has no eval dataset (the run evaluated nothing): "
        "give --data"
    )
