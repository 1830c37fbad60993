"""Episodes an agent harness plays against the endpoint: the transcript is the calls chained
token for token (the harness's own text fed, out of the loss; the sampled tokens in it with
their logprobs), the reward is the harness's, and an episode that rewrote a turn or raised is
dropped with a warning; `oncurve train rollout.env=harness:...` trains on it."""

from __future__ import annotations

import asyncio
import math
import time

import numpy
import pytest
import torch
from helpers.configs import make_config
from helpers.episodes import (
    SlowSampler,
    load_qwen3_tokenizer,
    replier_sampler,
    scripted_sampler,
    settings,
)
from helpers.harnesses import FOLLOW_UP, digits, fails, rewrites_its_turn, two_turns
from helpers.models import tiny_qwen2
from helpers.rewards_for_tests import DigitsEnv
from helpers.runs import metric_rows

from oncurve.errors import UserError
from oncurve.loop.trainer import train
from oncurve.rollout import SamplingParams, TorchSampler
from oncurve.rollout.env_calls import ERROR, TIMEOUT, EnvFaults
from oncurve.rollout.episodes import feed_overhead, run_episodes
from oncurve.rollout.harness import HarnessSettings, play_harness
from oncurve.rollout.hf_decoder import HFDecoder

pytest.importorskip("openai", reason="the openai client is not installed")
ROWS = [{"prompt": "What is 2 + 2?"}, {"prompt": "What is 3 + 3?"}]


@pytest.fixture(scope="module")
def sampler() -> TorchSampler:
    tokenizer = load_qwen3_tokenizer()
    model = tiny_qwen2(len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.max_position_embeddings = 4096  # a game's transcript is longer than 256
    return TorchSampler(model, tokenizer)


def play(sampler, harness, faults: EnvFaults | None = None):
    settings = HarnessSettings(harness, 2, 64, faults or EnvFaults())
    rows = [{**row, "prompt_ids": sampler.tokenizer(row["prompt"]).input_ids} for row in ROWS]
    rollout, columns = play_harness(
        sampler, rows, 2, SamplingParams(max_new_tokens=6, seed=1), settings
    )
    return rollout, columns["episode_reward"], columns["turns"], columns["episode_fault"]


def test_an_observation_of_max_observation_tokens_fits_with_its_template_tokens():
    """Two turns of max_new_tokens and, between them, a message of exactly
    max_observation_tokens tokens of text: the episode fits its budget, the chat template's
    tokens around the message counted in it (they were not, and the episode was dropped)."""
    tokenizer = load_qwen3_tokenizer()
    turn_tokens, observed = 8, 16
    turn = tokenizer(" ok" * turn_tokens, add_special_tokens=False).input_ids[: turn_tokens - 1]
    observation = " x" * observed
    assert len(tokenizer(observation, add_special_tokens=False).input_ids) == observed
    sampler, _ = scripted_sampler(tokenizer, [[*turn, tokenizer.eos_token_id]])

    async def tells(client, model, row):
        messages = [{"role": "user", "content": row["prompt"]}]
        first = await client.chat.completions.create(model=model, messages=messages)
        messages.append({"role": "assistant", "content": first.choices[0].message.content})
        messages.append({"role": "user", "content": observation})
        await client.chat.completions.create(model=model, messages=messages)
        return 1.0

    overhead = feed_overhead(tokenizer)
    assert overhead > 5  # <|im_end|>, the user header, the assistant header
    harness = HarnessSettings(tells, 2, observed, observation_overhead=overhead)
    rows = [{"prompt": "go", "prompt_ids": tokenizer("go").input_ids}]
    params = SamplingParams(max_new_tokens=turn_tokens, seed=0)
    rollout, columns = play_harness(sampler, rows, 1, params, harness)
    assert columns["episode_fault"] == [None] and columns["turns"] == [2]
    assert columns["episode_reward"] == [1.0] and int(rollout.loss_mask.sum()) == 2 * turn_tokens
    assert columns["episode_end"] == ["done"]


def test_a_harness_episode_whose_last_turn_was_cut_is_marked_length():
    tokenizer = load_qwen3_tokenizer()
    sampler, _ = scripted_sampler(tokenizer, [tokenizer(" ok" * 8).input_ids])

    async def asks_once(client, model, row):
        messages = [{"role": "user", "content": row["prompt"]}]
        await client.chat.completions.create(model=model, messages=messages)
        return 1.0

    rows = [{"prompt": "go", "prompt_ids": tokenizer("go").input_ids}]
    params = SamplingParams(max_new_tokens=4, seed=0)
    _, columns = play_harness(sampler, rows, 1, params, HarnessSettings(asks_once, 2, 16))
    assert columns["episode_end"] == ["length"] and columns["episode_reward"] == [1.0]


def test_a_harness_episode_with_a_turn_cut_before_its_last_is_marked_length():
    """A turn cut at max_new_tokens that the harness answered and went on from still marks
    the episode `length`, as a cut turn ends the in-process loop's episodes."""
    tokenizer = load_qwen3_tokenizer()
    sampler = replier_sampler(
        tokenizer, lambda text: ("ok", True) if FOLLOW_UP in text else (" ok" * 8, False)
    )
    rows = [{"prompt": "go", "prompt_ids": tokenizer("go").input_ids}]
    params = SamplingParams(max_new_tokens=4, seed=0)
    _, columns = play_harness(sampler, rows, 1, params, HarnessSettings(two_turns, 2, 64))
    assert columns["turns"] == [2] and columns["episode_fault"] == [None]
    assert columns["episode_end"] == ["length"]


@pytest.mark.parametrize(
    ("said", "end", "fault"),
    [
        ("done", "done", None),
        ("max_turns", "max_turns", None),
        ("length", "length", None),
        ("won", "error", ERROR),
        (3, "error", ERROR),
    ],
)
def test_a_harness_says_what_ended_its_episode_under_episode_end(said, end, fault, capsys):
    tokenizer = load_qwen3_tokenizer()
    sampler = replier_sampler(tokenizer, lambda text: ("ok", True))

    async def ends(client, model, row):
        messages = [{"role": "user", "content": row["prompt"]}]
        await client.chat.completions.create(model=model, messages=messages)
        return {"reward": 1.0, "episode_end": said}

    rows = [{"prompt": "go", "prompt_ids": tokenizer("go").input_ids}]
    settings = HarnessSettings(ends, 2, 16, EnvFaults(on_error="none"))
    _, columns = play_harness(sampler, rows, 1, SamplingParams(max_new_tokens=4), settings)
    assert columns["episode_end"] == [end] and columns["episode_fault"] == [fault]
    assert columns["episode_metrics"] == [{}]
    if fault:
        assert (
            f"the harness returned the episode_end {said!r} (done, length or max_turns)"
            in capsys.readouterr().err
        )


def test_a_harness_s_episode_is_its_calls_chained_token_for_token(sampler):
    rollout, rewards, turns, faults = play(sampler, two_turns)
    tok = sampler.tokenizer
    assert turns == [2] * 4 and faults == [None] * 4
    assert all(r in (0.0, 1.0) for r in rewards)
    first = tok.apply_chat_template(
        [{"role": "user", "content": ROWS[1]["prompt"]}], add_generation_prompt=True,
        tokenize=True, return_dict=False,
    )  # fmt: skip
    prompt = rollout.prompt_ids[2][rollout.prompt_mask[2].bool()].tolist()
    assert prompt == list(first)
    for i in range(4):
        ids = rollout.completion_ids[i][rollout.completion_mask[i].bool()]
        fed = ids[rollout.tool_mask[i][: len(ids)].bool()]
        assert FOLLOW_UP in tok.decode(fed) and "<|im_start|>assistant" in tok.decode(fed)
        sampled = rollout.loss_mask[i].bool()
        assert 2 <= int(sampled.sum()) <= 12
        assert bool((rollout.logprobs[i][sampled] < 0).all())
        assert bool((rollout.logprobs[i][~sampled] == 0).all())
    assert rollout.group_size == 2


def test_an_episode_that_rewrote_a_turn_or_raised_is_dropped(sampler, capsys):
    rollout, rewards, _, faults = play(sampler, rewrites_its_turn, EnvFaults(on_error="none"))
    assert faults == [ERROR] * 4 and all(math.isnan(r) for r in rewards)
    assert int(rollout.loss_mask.sum()) == 0
    assert "4 of 4 harness episodes dropped" in capsys.readouterr().err
    _, rewards, _, faults = play(sampler, fails, EnvFaults(on_error="none"))
    assert faults == [ERROR] * 4 and all(math.isnan(r) for r in rewards)
    assert "the harness raised RuntimeError: the harness's bug" in capsys.readouterr().err
    with pytest.raises(UserError, match=r"^rollout.env: the harness raised RuntimeError"):
        play(sampler, fails)  # reward.errors=raise, the default


def test_an_episode_a_group_harness_says_timed_out_is_a_timeout(sampler):
    async def timed_out(clients, model: str, row: dict) -> list:
        return [TimeoutError("the game server stalled")] * len(clients)

    rows = [{**row, "prompt_ids": sampler.tokenizer(row["prompt"]).input_ids} for row in ROWS]
    faults = EnvFaults(timeout_score=None)
    settings = HarnessSettings(timed_out, 2, 64, faults, groups=True)
    _, columns = play_harness(sampler, rows, 2, SamplingParams(max_new_tokens=6), settings)
    assert columns["episode_fault"] == [TIMEOUT] * 4
    assert all(math.isnan(r) for r in columns["episode_reward"])


def test_a_harness_that_blocks_its_event_loop_times_out_alone(sampler, capsys):
    """A harness that blocks (a synchronous HTTP client, `time.sleep`) cannot be interrupted:
    past `rollout.env_timeout_s` its episode is a timeout all the same, scored as
    `reward.timeout_score` says, and it holds up no other episode's clock."""

    async def blocks_on_the_first_row(client, model: str, row: dict) -> float:
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": row["prompt"]}]
        )
        if row["prompt"] == ROWS[0]["prompt"]:
            time.sleep(5)
        return 1.0

    faults = EnvFaults(timeout_s=3.0, timeout_score=-1.0)
    _, rewards, _, episode_faults = play(sampler, blocks_on_the_first_row, faults)
    assert episode_faults == [TIMEOUT, TIMEOUT, None, None]
    assert rewards == [-1.0, -1.0, 1.0, 1.0]
    err = capsys.readouterr().err
    assert "2 of 4 harness episodes dropped from the loss (2 scored -1 by the fault" in err
    assert "blocked its event loop" in err


async def asks_then_hangs(client, model: str, row: dict) -> float:
    await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": row["prompt"]}]
    )
    await asyncio.sleep(3600)
    return 1.0


def test_the_time_limit_counts_what_a_harness_does_outside_its_calls(sampler):
    """`rollout.env_timeout_s` bounds an episode's own time, not the sampler's: two turns
    that each wait over half a second on the sampler play out under a limit of 0.4 s, while a
    harness that stops calling and never returns still times out once its own time is up."""
    slow = SlowSampler(sampler.model, sampler.tokenizer)
    faults = EnvFaults(timeout_s=0.4, timeout_score=-1.0)
    _, rewards, turns, episode_faults = play(slow, two_turns, faults)
    assert episode_faults == [None] * 4 and turns == [2] * 4
    assert all(r in (0.0, 1.0) for r in rewards)
    started = time.monotonic()
    _, rewards, turns, episode_faults = play(slow, asks_then_hangs, faults)
    assert episode_faults == [TIMEOUT] * 4 and rewards == [-1.0] * 4 and turns == [1] * 4
    assert time.monotonic() - started < 60  # not the hour it would sleep


def test_a_group_s_time_limit_counts_what_it_does_outside_its_episodes_calls(sampler):
    """A group harness's clock stops while any of its episodes waits on the endpoint."""

    async def group_of_two_turns(clients, model: str, row: dict) -> list:
        return list(await asyncio.gather(*(two_turns(c, model, row) for c in clients)))

    slow = SlowSampler(sampler.model, sampler.tokenizer)
    rows = [{**row, "prompt_ids": sampler.tokenizer(row["prompt"]).input_ids} for row in ROWS]
    settings = HarnessSettings(group_of_two_turns, 2, 64, EnvFaults(timeout_s=0.4), groups=True)
    _, columns = play_harness(slow, rows, 2, SamplingParams(max_new_tokens=6, seed=1), settings)
    assert columns["episode_fault"] == [None] * 4 and columns["turns"] == [2] * 4


def test_a_mapping_without_a_reward_is_an_error_naming_its_keys(sampler, capsys):
    async def scores(client, model: str, row: dict) -> dict:
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": row["prompt"]}]
        )
        return {"score": 1.0, "turns": 1}

    _, rewards, _, faults = play(sampler, scores, EnvFaults(on_error="none"))
    assert faults == [ERROR] * 4 and all(math.isnan(r) for r in rewards)
    assert (
        "the harness returned a mapping without a \"reward\" key (its keys: 'score', 'turns')"
        in capsys.readouterr().err
    )


def test_numpy_rewards_and_metrics_are_numbers(sampler):
    """A rubric's numpy scalars (float32, int64) are rewards and metrics like Python's
    numbers, as floats; a bool is neither."""

    async def numpy_scores(client, model: str, row: dict) -> dict:
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": row["prompt"]}]
        )
        if row["prompt"] == ROWS[0]["prompt"]:
            return numpy.float32(0.75)
        return {"reward": numpy.float32(0.5), "part": numpy.float32(0.25),
                "turns": numpy.int64(1), "flag": True}  # fmt: skip

    rows = [{**row, "prompt_ids": sampler.tokenizer(row["prompt"]).input_ids} for row in ROWS]
    settings = HarnessSettings(numpy_scores, 2, 64, EnvFaults())
    _, columns = play_harness(sampler, rows, 2, SamplingParams(max_new_tokens=6), settings)
    assert columns["episode_fault"] == [None] * 4
    assert columns["episode_reward"] == [0.75, 0.75, 0.5, 0.5]
    assert all(type(r) is float for r in columns["episode_reward"])
    assert columns["episode_metrics"] == [{}, {}] + [{"part": 0.25, "turns": 1.0}] * 2
    metrics = columns["episode_metrics"][2]
    assert all(type(v) is float for v in metrics.values())


def test_a_reward_past_float32_is_an_error_not_inf(sampler):
    async def huge(client, model: str, row: dict) -> float:
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": row["prompt"]}]
        )
        return 1e39

    rows = [{**row, "prompt_ids": sampler.tokenizer(row["prompt"]).input_ids} for row in ROWS]
    settings = HarnessSettings(huge, 2, 64, EnvFaults(on_error="none"))
    _, columns = play_harness(sampler, rows, 1, SamplingParams(max_new_tokens=4), settings)
    assert columns["episode_fault"] == [ERROR, ERROR]
    assert all(math.isnan(r) for r in columns["episode_reward"])


def test_a_harness_that_raises_cancelled_error_fails_its_episode(sampler):
    async def cancelled(client, model: str, row: dict) -> float:
        raise asyncio.CancelledError("the harness cancelled itself")

    _, rewards, _, faults = play(sampler, cancelled, EnvFaults(on_error="none"))
    assert faults == [ERROR] * 4 and all(math.isnan(r) for r in rewards)


def test_a_run_trains_on_a_harness(chat_model_dir, data_file, tmp_path):
    # one thread: the random model's samples, any of which could end a turn on a special token
    # that no harness can continue, are the same whatever the machine
    config = make_config(
        chat_model_dir, data_file, tmp_path / "run", "rollout.env=harness:helpers.harnesses:two_turns",
        "rollout.max_turns=2", "rollout.max_observation_tokens=64", "data.chat_template=true",
        "reward.functions=[env]", "run.steps=1", "eval.at_start_end=false", "run.threads=1",
    )  # fmt: skip
    train(config, quiet=True)
    (row,) = metric_rows(tmp_path / "run")
    assert row["episode/turns_mean"] == 2.0 and row["episode/errors"] == 0.0
    assert 0.0 <= row["reward/env"] <= 1.0


@pytest.mark.parametrize(("min_new_tokens", "turn_tokens"), [(0, 1), (2, 3)])
def test_an_environment_through_the_endpoint_is_the_environment_played_in_process(
    min_new_tokens, turn_tokens
):
    """Greedy, an environment played by a harness against the endpoint gives the tokens, the
    fed positions and the rewards that the in-process episode loop gives, over three turns
    (the model's EOS logit raised: each turn ends at once, its empty text spliced back as
    its EOS token, or after `rollout.min_new_tokens`, which holds in every turn)."""

    tok = load_qwen3_tokenizer()
    model = tiny_qwen2(len(tok), seed=1)
    model.config.eos_token_id = tok.eos_token_id
    model.config.max_position_embeddings = 4096
    eos_bias = torch.zeros(len(tok))
    eos_bias[tok.eos_token_id] = 100.0
    model.lm_head.bias = torch.nn.Parameter(eos_bias)
    sampler = TorchSampler(model, tok, decoder=HFDecoder)
    rows = [{"prompt": "Count to three."}, {"prompt": "Name a prime."}]
    params = SamplingParams(
        max_new_tokens=5, temperature=0.0, seed=0, min_new_tokens=min_new_tokens
    )
    played = run_episodes(
        sampler, rows, 1, params, settings(tok, lambda: DigitsEnv(3), max_turns=3, role="user")
    )
    in_process = played.rollout
    harness = HarnessSettings(digits, 3, 256)
    through, columns = play_harness(sampler, rows, 1, params, harness)
    assert columns["episode_reward"] == played.rewards.tolist()
    assert columns["episode_fault"] == [None, None] and columns["turns"] == [3, 3]
    assert in_process.finish_reasons == through.finish_reasons == ["eos", "eos"]
    for i in range(2):
        a = in_process.input_ids[i][in_process.attention_mask[i].bool()].tolist()
        b = through.input_ids[i][through.attention_mask[i].bool()].tolist()
        assert a == b
        width = int(in_process.completion_mask[i].sum())
        assert in_process.tool_mask[i][:width].tolist() == through.tool_mask[i][:width].tolist()
        sampled = int(in_process.loss_mask[i].sum())
        assert sampled == int(through.loss_mask[i].sum()) == 3 * turn_tokens


def test_a_harness_s_prompts_and_feeds_carry_data_chat_template_kwargs():
    """Qwen3's `enable_thinking: false` closes an empty think block after each generation
    prompt the endpoint renders for a harness, and the budget's feed overhead counts it."""
    import dataclasses

    from oncurve.config import load_config
    from oncurve.rollout.episodes import feed_overhead
    from oncurve.run.setup import episode_settings

    tokenizer = load_qwen3_tokenizer()
    sampler, _ = scripted_sampler(tokenizer, [tokenizer(" ok").input_ids])
    asked = []

    async def asks_once(client, model, row):
        messages = [{"role": "user", "content": row["prompt"]}]
        answer = await client.chat.completions.create(model=model, messages=messages)
        asked.append(answer.model_extra["prompt_token_ids"])
        return 1.0

    options = ["rollout.env=harness:helpers.harnesses:digits", "data.chat_template=true"]
    config = load_config(None, [*options, "data.chat_template_kwargs.enable_thinking=false"])
    harness = dataclasses.replace(episode_settings(config, tokenizer), play=asks_once)
    thinking = episode_settings(load_config(None, options), tokenizer)
    # the block's four tokens: <think>, its blank line, </think>, the blank line after it
    assert harness.observation_overhead == thinking.observation_overhead + 4
    assert harness.observation_overhead == feed_overhead(tokenizer, {"enable_thinking": False})
    rows = [{"prompt": "go", "prompt_ids": tokenizer("go").input_ids}]
    play_harness(sampler, rows, 1, SamplingParams(max_new_tokens=2, seed=0), harness)
    assert tokenizer.decode(asked[0]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
