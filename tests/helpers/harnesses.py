"""Agent harnesses as users write them for `rollout.env: harness:module:function`: an async
function that plays one episode with an OpenAI client and returns its reward."""

from __future__ import annotations

FOLLOW_UP = "Are you sure?"


async def two_turns(client, model: str, row: dict) -> float:
    """Asks the row's prompt, then asks again after the answer; pays the second answer's
    length parity (a number that differs between episodes)."""
    messages = [{"role": "user", "content": row["prompt"]}]
    first = await client.chat.completions.create(model=model, messages=messages)
    messages.append({"role": "assistant", "content": first.choices[0].message.content})
    messages.append({"role": "user", "content": FOLLOW_UP})
    second = await client.chat.completions.create(model=model, messages=messages)
    return float(len(second.choices[0].message.content) % 2)


async def rewrites_its_turn(client, model: str, row: dict) -> float:
    """As `two_turns`, but sends its first answer back edited: the episode cannot train."""
    messages = [{"role": "user", "content": row["prompt"]}]
    first = await client.chat.completions.create(model=model, messages=messages)
    edited = first.choices[0].message.content + " (edited)"
    messages += [{"role": "assistant", "content": edited}, {"role": "user", "content": FOLLOW_UP}]
    await client.chat.completions.create(model=model, messages=messages)
    return 1.0


async def fails(client, model: str, row: dict) -> float:
    """Raises after one call."""
    await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
    raise RuntimeError("the harness's bug")


async def digits(client, model: str, row: dict) -> float:
    """`DigitsEnv(3)` played through the endpoint as `rollout.env` plays it in-process: its
    answers as user turns, a turn cut at the length limit the last; the steps' rewards summed."""
    from helpers.rewards_for_tests import DigitsEnv

    env = DigitsEnv(3)
    messages = [{"role": "user", "content": env.reset(row)}]
    total = 0.0
    while True:
        answer = await client.chat.completions.create(model=model, messages=messages)
        choice = answer.choices[0]
        observation, reward, done = env.step(choice.message.content)
        total += reward
        if done or observation is None or choice.finish_reason == "length":
            return total
        messages += [
            {"role": "assistant", "content": choice.message.content},
            {"role": "user", "content": observation},
        ]
