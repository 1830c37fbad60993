"""An OpenAI-compatible endpoint over oncurve's sampler, for agent harnesses that talk to one.

`POST /v1/chat/completions` and `POST /v1/completions` on the loopback interface only, sampled
with the run's settings (a request may shorten `max_tokens` and add `stop` strings, and ask for
`n` choices; its temperature and the like are the run's, so that what trains is on-policy).
Each response carries vLLM's extension fields: `prompt_token_ids`, and per choice `token_ids`
and the sampler's logprobs. A choice's text ends before the stop string that ended it, as
OpenAI's and vLLM's do, while its `token_ids` run to the token that completed the stop string
(so they can decode to more than the text: stop "Hel" answers "Say " and the ids of
"Say Hello"). With `stream: true` the answer comes as OpenAI's server-sent events
(`stream_events`), each choice whole in one chunk. Requests that arrive within `max_wait_s` of
each other are sampled in one call (a request that cannot be, a prompt too long, fails alone).

The chat template is applied once, here, with the run's `data.chat_template_kwargs`: an
assistant message whose text is a completion this endpoint sampled for the same episode (as
answered, or with its stop string) is spliced back as the tokens it sampled, so a conversation's tokens are the ones the policy produced; one it did
not sample (text a harness rewrote) is tokenized as text, and its call marked `rewritten`; a
special token's name in any string of a request that the template shows (a message's text, a
tool call's name or arguments, a tool's definition) is tokenized as that name's text, and so is
an added token's that is not special (Qwen's `</tool_response>`) in a message that is not the
assistant's. A last assistant message is continued, as a dataset's conversational prompt is
(`oncurve.data.files.chat_template_ending`). A request's `tools` are shown to the model through
its chat template and its calls answered as OpenAI's `tool_calls`
(`oncurve.rollout.tool_calls`: the Hermes and Llama 3 JSON formats). Every call is kept in
`Endpoint.calls`, and the time each episode's requests spent in the endpoint is counted
(`Endpoint.seconds_in_calls`: the part of an episode's time that is the sampler's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import queue
import re
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from oncurve.data.files import chat_template_ending
from oncurve.errors import UserError
from oncurve.rollout.base import Sampler, SamplingParams, spelled_out
from oncurve.rollout.tool_calls import (
    FORMATS,
    parse_tool_calls,
    reply_key,
    template_message,
    tool_call_format,
)

LOOPBACK = ("127.0.0.1", "::1")
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
_ROUTE = re.compile(r"(?:/e/(?P<episode>\d+))?(?P<path>/v1/(?:chat/)?completions)")
# (a nonce of the prompt's, the number of the ids it stands for)
_MARK = "\u2063oncurve-{}-{}\u2063"


class _Server(ThreadingHTTPServer):
    # every episode of a step connects at once: the default backlog of 5 refuses the rest
    request_queue_size = 1024
    daemon_threads = True


@dataclasses.dataclass(frozen=True)
class Call:
    """One choice the endpoint sampled: the prompt's and the completion's token ids, the
    sampler's logprob of each completion token, its finish reason ("eos", "stop", "length"),
    its text (the sampler's: cut after the stop string that ended it), the text answered (cut
    before that stop string, as OpenAI and vLLM answer), whether its prompt held text the
    endpoint did not sample, and the episode whose URL it came through
    (`Endpoint.episode_url`; None: `base_url`)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    answer: str
    rewritten: bool
    episode: int | None = None


@dataclasses.dataclass
class _Request:
    prompt_ids: list[int]
    rewritten: bool
    n: int
    params: SamplingParams
    episode: int | None
    done: Future = dataclasses.field(default_factory=Future)


class Endpoint:
    """The endpoint, served for the `with` block (`base_url`), gone after it."""

    def __init__(
        self,
        sampler: Sampler,
        params: SamplingParams,
        *,
        model_name: str = "oncurve",
        max_wait_s: float = 0.005,
        seed: int = 0,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.sampler, self.params, self.model_name = sampler, params, model_name
        self.max_wait_s, self.seed = max_wait_s, seed
        # the run's `data.chat_template_kwargs`: a conversation is rendered as its prompt was
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.calls: list[Call] = []
        self.sampler_calls = 0
        # (episode, a reply's text and tool calls) -> the token ids sampled for it: per episode,
        # as two episodes may sample one text as different tokens
        self._sampled: dict[tuple[int | None, Any], list[int]] = {}
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._lock = threading.Lock()
        # episode -> [start, end] (time.monotonic; end inf while in progress) of each of its calls
        self._spans: dict[int, list[list[float]]] = {}
        self._server: _Server | None = None

    def episode_url(self, episode: int) -> str:
        """A base URL whose calls are marked with `episode` (`Call.episode`)."""
        return self.base_url.replace("/v1", f"/e/{episode}/v1")

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT/v1`, what a harness's OpenAI client is given."""
        assert self._server is not None, "the endpoint is served inside its `with` block"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> Endpoint:
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._threads = [
            threading.Thread(target=self._server.serve_forever, daemon=True),
            threading.Thread(target=self._sample_batches, daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
        self._queue.put(None)
        for thread in self._threads:
            thread.join()
        self._server = None

    def seconds_in_calls(self, episodes: Iterable[int]) -> float:
        """Seconds so far during which at least one of `episodes` had a request in the endpoint
        (read, queued, sampled, answered): the time its harness spent waiting on the sampler."""
        now = time.monotonic()
        with self._lock:
            spans = sorted((a, min(b, now)) for k in episodes for a, b in self._spans.get(k, ()))
        total, reached = 0.0, -math.inf
        for start, end in spans:  # overlapping calls (a group's episodes at once) count once
            if end > reached:
                total += end - max(start, reached)
                reached = end
        return total

    @contextlib.contextmanager
    def _in_call(self, episode: int | None) -> Iterator[None]:
        """Times a request of `episode` (none for `base_url`'s) for `seconds_in_calls`."""
        span = [time.monotonic(), math.inf]
        if episode is not None:
            with self._lock:
                self._spans.setdefault(episode, []).append(span)
        try:
            yield
        finally:
            with self._lock:
                span[1] = time.monotonic()

    # -- prompts ------------------------------------------------------------------------------

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        episode: int | None = None,
    ) -> tuple[list[int], bool]:
        """The token ids of `messages` in the chat template (showing `tools`), ended as a
        dataset's conversational prompt is (`chat_template_ending`: a last assistant message
        continued, else a generation prompt): every assistant message whose text (and tool
        calls) this endpoint sampled for `episode` as the ids it sampled, and a special token's
        name in any other string the template shows (a message's content or reasoning, a tool
        call's name or arguments, a tool's definition: a tool that printed `<|im_end|>`, an
        assistant turn a harness rewrote; in a message of another role than the assistant's,
        every added token's name: Qwen's `</tool_response>`) as that name's text's ids, so that
        it cannot end its message or forge a turn; and whether any assistant message was one it did not sample.
        Where the template drops a sampled turn, the whole conversation is its text (each
        special token's name in it still text), and counts as not sampled."""
        tokenizer = self.sampler.tokenizer
        ending = chat_template_ending(messages, "messages")

        def render(marked: list[dict[str, Any]], splices: _Splices) -> str:
            shown = {"tools": splices.escaped(tools)} if tools else {}
            return tokenizer.apply_chat_template(
                marked, tokenize=False, **ending, **shown, **self.chat_template_kwargs
            )

        splices, marked, rewritten = _Splices(tokenizer), [], False
        for message in messages:
            content = message.get("content")
            calls = message.get("tool_calls")
            if message.get("role") == "assistant" and (isinstance(content, str) or calls):
                with self._lock:
                    sampled_ids = self._sampled.get((episode, reply_key(content, calls)))
                if sampled_ids is not None:
                    marked.append({"role": "assistant", "content": splices.turn(sampled_ids)})
                    continue
                rewritten = True
                message = template_message(message) if calls else message
            marked.append(splices.escaped(message, message.get("role") != "assistant"))
        text = render(marked, splices)
        if splices.shows_every_turn(text):
            return splices.encode(text), rewritten
        as_text = _Splices(tokenizer)
        whole = [template_message(m) if m.get("tool_calls") else m for m in messages]
        shown = [as_text.escaped(m, m.get("role") != "assistant") for m in whole]
        return as_text.encode(render(shown, as_text)), True

    def remember_reply(
        self, key: Any, completion_ids: list[int], episode: int | None = None
    ) -> None:
        """That an assistant message identified by `key` (`reply_key`: its text and tool calls
        as answered) is `completion_ids`, which a later prompt of `episode` holding it splices
        back."""
        with self._lock:
            self._sampled[episode, key] = completion_ids

    def encode_text(self, text: str) -> list[int]:
        """`text`'s token ids, no special tokens added (a template's are in its text)."""
        return self.sampler.tokenizer(text, add_special_tokens=False)["input_ids"]

    # -- sampling -----------------------------------------------------------------------------

    def sample(
        self,
        prompt_ids: list[int],
        rewritten: bool,
        n: int,
        params: SamplingParams,
        episode: int | None = None,
    ) -> list[Call]:
        """The `n` Calls of one request, sampled with the other requests that arrive within
        `max_wait_s` (from any thread)."""
        request = _Request(prompt_ids, rewritten, n, params, episode)
        self._queue.put(request)
        return request.done.result()

    def _sample_batches(self) -> None:
        while (first := self._queue.get()) is not None:
            batch, deadline = [first], time.perf_counter() + self.max_wait_s
            while (left := deadline - time.perf_counter()) > 0:
                try:
                    request = self._queue.get(timeout=left)
                except queue.Empty:
                    break
                if request is None:
                    self._queue.put(None)
                    break
                batch.append(request)
            by_params: dict[SamplingParams, list[_Request]] = {}
            for request in batch:
                by_params.setdefault(request.params, []).append(request)
            for params, requests in by_params.items():
                self._sample_or_fail(params, requests)

    def _sample_or_fail(self, params: SamplingParams, requests: list[_Request]) -> None:
        """`_sample`, or its error answered to the callers: to each request's alone where
        several failed together (one prompt too long for the room left fails the whole call)."""
        try:
            self._sample(params, requests)
        except Exception as error:
            waiting = [request for request in requests if not request.done.done()]
            if len(waiting) == 1:
                waiting[0].done.set_exception(error)
            for request in waiting if len(waiting) > 1 else []:
                self._sample_or_fail(params, [request])

    def _sample(self, params: SamplingParams, requests: list[_Request]) -> None:
        prompts = [r.prompt_ids for r in requests for _ in range(r.n)]
        seeded = dataclasses.replace(params, seed=self.seed + self.sampler_calls)
        self.sampler_calls += 1
        out = self.sampler.generate_ids(prompts, 1, seeded)
        # one read of the call's results, not three per row
        lengths = out.completion_mask.sum(1).tolist()
        all_ids, all_logprobs = out.completion_ids.tolist(), out.logprobs.tolist()
        row = 0
        for request in requests:
            calls = []
            for _ in range(request.n):
                length, text, reason = lengths[row], out.texts[row], out.finish_reasons[row]
                calls.append(
                    Call(
                        request.prompt_ids,
                        all_ids[row][:length],
                        all_logprobs[row][:length],
                        reason,
                        text,
                        _before_stop(text, params.stop) if reason == "stop" else text,
                        request.rewritten,
                        request.episode,
                    )
                )
                row += 1
            with self._lock:
                self.calls += calls
                # a turn sent back as answered, or with the stop string a harness put back
                for call in calls:
                    for said in (call.answer, call.text):
                        self._sampled[call.episode, said] = call.completion_ids
            request.done.set_result(calls)

    def request_params(self, body: dict[str, Any]) -> SamplingParams:
        """The run's sampling settings, with the request's `max_tokens` (or
        `max_completion_tokens`) when shorter and its `stop` strings (a string or a list of
        them) added; ValueError naming the field for another `stop`."""
        limit = None
        for key in ("max_completion_tokens", "max_tokens"):
            if body.get(key) is not None:
                limit = _count(body, key)
                break
        longest = self.params.max_new_tokens
        stop = body.get("stop")
        stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop: a non-empty string or a list of them, got {stop!r}")
        return dataclasses.replace(
            self.params,
            max_new_tokens=min(int(limit), longest) if limit else longest,
            stop=tuple(dict.fromkeys([*self.params.stop, *stop])),
        )


class _Splices:
    """Marks put in a chat template's text where token ids go in its place: a sampled turn's
    ids, or a special token's name as the ids of its text. A name is marked where it stands in
    a string, not the string as a whole, so that it stays text whether the template shows the
    string as it is or inside JSON (a tool call's arguments, a tool's definition)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        # a mark no message holds: a tool's output that printed one would split the text there
        nonce = secrets.token_hex(8)
        self._mark = functools.partial(_MARK.format, nonce)
        before, after = _MARK.format(nonce, "\0").split("\0")
        self._marks = re.compile(f"{re.escape(before)}(\\d+){re.escape(after)}")
        names = sorted(tokenizer.all_special_tokens, key=len, reverse=True)
        self._names = re.compile("|".join(map(re.escape, names))) if names else None
        # added tokens that are not special (Qwen's `<tool_response>`, `<tool_call>`): spelled
        # out in the messages of other roles than the assistant's, whose text a template may
        # read them in (Qwen3's splits a turn's reasoning at `</think>`)
        added = getattr(tokenizer, "added_tokens_decoder", {})
        plain = {t.content for t in added.values() if not t.special} - set(names)
        every = sorted({*names, *plain}, key=len, reverse=True)
        self._every_name = re.compile("|".join(map(re.escape, every))) if plain else self._names
        self._ids: list[list[int]] = []
        self._turns: set[int] = set()
        self._named: dict[str, str] = {}

    def turn(self, ids: list[int]) -> str:
        """The mark of a sampled turn of `ids`."""
        self._turns.add(len(self._ids))
        return self._splice(ids)

    def escaped(self, value: Any, every_added: bool = False) -> Any:
        """`value` (text, or lists and mappings of it: a message, a tool) with every special
        token's name in its text (`every_added`: every added token's), a mapping's keys
        included, replaced by the mark of that name's text's ids."""
        names = self._every_name if every_added else self._names
        if isinstance(value, str):
            return names.sub(self._name, value) if names else value
        if isinstance(value, dict):
            return {
                self.escaped(key, every_added): self.escaped(item, every_added)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [self.escaped(item, every_added) for item in value]
        return value

    def shows_every_turn(self, text: str) -> bool:
        """Whether `text` holds the mark of every sampled turn (a template may drop a turn)."""
        return self._turns <= {int(number) for number in self._marks.findall(text)}

    def encode(self, text: str) -> list[int]:
        """The ids of `text` (a template's, so its special tokens' names are those tokens) with
        each mark's ids in its place, a sampled turn's ending EOS standing for the template's
        end of that turn."""
        parts = self._marks.split(text)  # text, a mark's number, text, ..., text
        numbers = [int(number) for number in parts[1::2]]
        eos = self.tokenizer.eos_token or ""
        ids = self._encode(parts[0])
        for number, after in zip(numbers, parts[2::2], strict=True):
            spliced = self._ids[number]
            ids += spliced
            ended = number in self._turns and self.tokenizer.decode(spliced[-1:]) == eos
            if eos and ended and after.startswith(eos):
                after = after[len(eos) :]  # the turn's end is the sampled EOS token
            ids += self._encode(after)
        return ids

    def _name(self, match: re.Match[str]) -> str:
        name = match[0]
        if name not in self._named:
            if self._names is not None and self._names.fullmatch(name):  # a special token's
                ids = self.tokenizer(name, add_special_tokens=False, split_special_tokens=True)
                self._named[name] = self._splice(ids["input_ids"])
            else:
                self._named[name] = self._splice(spelled_out(self.tokenizer, name))
        return self._named[name]

    def _splice(self, ids: list[int]) -> str:
        self._ids.append(ids)
        return self._mark(len(self._ids) - 1)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def _before_stop(text: str, stops: tuple[str, ...]) -> str:
    """`text` (the sampler's, cut after the first stop string to end in it) up to where the
    first of `stops` in it begins."""
    return text[: min((text.find(stop) for stop in stops if stop in text), default=len(text))]


def _tools(body: dict[str, Any], tokenizer: Any) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The request's `tools` (OpenAI's function definitions) and the format the chat template
    writes calls in (`tool_call_format`), (None, None) without tools or with `tool_choice`
    "none"; ValueError for another `tool_choice` than "auto" (forcing a call would take the
    sampling out of the policy's hands), tools that are not a list of objects, or a chat
    template that writes no tool calls this endpoint reads."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools or choice == "none":  # as vLLM: tools the model may not call are not shown
        return None, None
    if choice not in (None, "auto"):
        raise ValueError(
            f"tool_choice: {json.dumps(choice)} is not read here (sampling is the policy's own); "
            'give "auto" or "none"'
        )
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("tools: a list of function definitions is required")
    format = tool_call_format(tokenizer)
    if format is None:
        raise ValueError(
            "tools: the model's chat template shows no tools in a format this endpoint reads "
            f"({', '.join(sorted(FORMATS))}: <tool_call> as Qwen2.5's, Qwen3's and Hermes "
            "models', bare JSON as Llama 3.1's to 3.3's)"
        )
    return tools, format


def _count(body: dict[str, Any], key: str) -> int:
    """`body[key]` as a count of at least 1; ValueError naming the key otherwise."""
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}: a whole number of at least 1, got {value!r}")
    return value


def _text_messages(messages: Any) -> list[dict[str, Any]]:
    """A request's `messages` with each content as text: OpenAI's list of parts joined when
    they are all text parts; ValueError for anything else."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: a non-empty list of messages is required")
    texts = []
    for k, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{k}]: an object with a role is required")
        content = message.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise ValueError(f"messages[{k}].content: only text parts are read")
            content = "".join(str(part.get("text", "")) for part in content)
        elif content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{k}]: content must be text or a list of text parts")
        calls = message.get("tool_calls")
        if calls is not None and not (
            isinstance(calls, list) and all(isinstance(c, dict) for c in calls)
        ):
            raise ValueError(f"messages[{k}].tool_calls: a list of tool calls is required")
        if content is None and not (message["role"] == "assistant" and calls):
            raise ValueError(f"messages[{k}]: content is required (null only beside tool_calls)")
        texts.append({**message, "content": content})
    return texts


def _choice_logprobs(tokenizer: Any, call: Call) -> dict[str, Any]:
    """OpenAI's chat `logprobs` of a choice: one entry per completion token."""
    tokens = tokenizer.convert_ids_to_tokens(call.completion_ids)
    return {
        "content": [
            {"token": token, "logprob": logprob, "top_logprobs": []}
            for token, logprob in zip(tokens, call.logprobs, strict=True)
        ]
    }


def _finish(call: Call) -> str:
    """OpenAI's finish reason: "length", else "stop" (EOS or a stop string)."""
    return "length" if call.finish_reason == "length" else "stop"


def _usage(calls: list[Call]) -> dict[str, int]:
    prompt, completion = len(calls[0].prompt_ids), sum(len(c.completion_ids) for c in calls)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def respond(
    endpoint: Endpoint, path: str, body: dict[str, Any], episode: int | None = None
) -> dict[str, Any]:
    """The JSON answer to a POST of `body` to `path` (`CHAT` or `COMPLETIONS`) for `episode`
    (whole: a `stream` request is sent it as `stream_events`); ValueError for a request it
    cannot serve."""
    n = _count(body, "n") if body.get("n") is not None else 1
    if n > 1 and episode is not None:
        raise ValueError(
            "n: an episode's calls are one chain of turns, which several choices of one call "
            "cannot all continue; ask for 1"
        )
    params = endpoint.request_params(body)
    if path == CHAT:
        tokenizer = endpoint.sampler.tokenizer
        tools, format = _tools(body, tokenizer)
        messages = _text_messages(body.get("messages"))
        prompt_ids, rewritten = endpoint.chat_prompt(messages, tools, episode)
        calls = endpoint.sample(prompt_ids, rewritten, n, params, episode)
        choices = []
        for i, call in enumerate(calls):
            content, tool_calls = call.answer, []
            if format:
                call_id = f"call_{secrets.token_hex(6)}"
                content, tool_calls = parse_tool_calls(call.answer, call_id, format)
                endpoint.remember_reply(
                    reply_key(content, tool_calls), call.completion_ids, episode
                )
            message = {"role": "assistant", "content": content}
            choices.append(
                {
                    "index": i,
                    "message": {**message, **({"tool_calls": tool_calls} if tool_calls else {})},
                    "finish_reason": "tool_calls" if tool_calls else _finish(call),
                    "token_ids": call.completion_ids,
                    "logprobs": _choice_logprobs(tokenizer, call),
                }
            )
        kind = "chat.completion"
    else:
        prompt = body.get("prompt")
        vocab = len(endpoint.sampler.tokenizer)
        if isinstance(prompt, str):
            prompt_ids = endpoint.encode_text(prompt)
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            if not all(0 <= t < vocab for t in prompt):
                raise ValueError(f"prompt: token ids must be in [0, {vocab})")
            prompt_ids = list(prompt)
        else:
            raise ValueError("prompt: a string or a list of token ids is required")
        calls = endpoint.sample(prompt_ids, False, n, params, episode)
        choices = [
            {
                "index": i,
                "text": call.answer,
                "finish_reason": _finish(call),
                "token_ids": call.completion_ids,
                "logprobs": {"token_logprobs": call.logprobs},
            }
            for i, call in enumerate(calls)
        ]
        kind = "text_completion"
    return {
        "id": f"{'chatcmpl' if path == CHAT else 'cmpl'}-{secrets.token_hex(12)}",
        "object": kind,
        "created": int(time.time()),
        "model": endpoint.model_name,
        "prompt_token_ids": calls[0].prompt_ids,
        "choices": choices,
        "usage": _usage(calls),
    }


def _streaming(body: dict[str, Any]) -> tuple[bool, bool]:
    """Whether `body` asks for a stream (`stream`) and for its usage in a last chunk
    (`stream_options.include_usage`); ValueError naming the field for anything else."""
    stream, options = body.get("stream"), body.get("stream_options")
    if stream is not None and not isinstance(stream, bool):
        raise ValueError(f"stream: true or false, got {stream!r}")
    if options is not None and not isinstance(options, dict):
        raise ValueError(f"stream_options: an object is required, got {options!r}")
    return bool(stream), bool((options or {}).get("include_usage"))


def stream_events(answer: dict[str, Any], include_usage: bool) -> bytes:
    """`answer` (`respond`'s) as the server-sent events of OpenAI's streamed answer: for each
    choice one chunk with all of it (a chat choice's role, content and tool calls as a `delta`,
    a completion's text) and its `token_ids` and logprobs, then one with its finish reason; the
    first chunk carries `prompt_token_ids`, a last one with no choices the usage when
    `include_usage`; then `data: [DONE]`. The choices are sampled whole before the first
    event: a stream is the answer in OpenAI's wire format, not tokens as they are drawn."""
    chat = answer["object"] == "chat.completion"
    head = {
        "id": answer["id"],
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": answer["created"],
        "model": answer["model"],
    }
    chunks = []
    for choice in answer["choices"]:
        if chat:
            message = choice["message"]
            delta = {"role": "assistant", "content": message["content"]}
            if calls := message.get("tool_calls"):
                delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(calls)]
            said, ended = {"delta": delta}, {"delta": {}}
        else:
            said, ended = {"text": choice["text"]}, {"text": ""}
        sampled = {"token_ids": choice["token_ids"], "logprobs": choice["logprobs"]}
        for part in ({**said, **sampled, "finish_reason": None},
                     {**ended, "finish_reason": choice["finish_reason"]}):  # fmt: skip
            chunks.append({**head, "choices": [{"index": choice["index"], **part}]})
    chunks[0]["prompt_token_ids"] = answer["prompt_token_ids"]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": answer["usage"]})
    events = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    return "".join([*events, "data: [DONE]\n\n"]).encode()


def _handler(endpoint: Endpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.client_address[0] not in LOOPBACK:
                return self._answer(403, {"error": {"message": "loopback clients only"}})
            route = _ROUTE.fullmatch(self.path)
            if route is None:
                return self._answer(404, {"error": {"message": f"no route {self.path}"}})
            episode = int(route["episode"]) if route["episode"] else None
            with endpoint._in_call(episode):
                self._serve(route["path"], episode)

        def _serve(self, path: str, episode: int | None) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length < 0:  # read(-1) would wait for the client to close
                    raise ValueError("Content-Length must be at least 0")
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
                stream, include_usage = _streaming(body)
                answer = respond(endpoint, path, body, episode)
                if stream:
                    events = stream_events(answer, include_usage)
                    self._send(200, "text/event-stream; charset=utf-8", events)
                else:
                    self._answer(200, answer)
            except (ValueError, TypeError, UserError) as error:
                self._answer(400, {"error": {"message": str(error), "type": "invalid_request"}})
            except Exception as error:  # the sampler's: the harness gets an answer, not a hang
                self._answer(500, {"error": {"message": f"{type(error).__name__}: {error}"}})

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                models = {
                    "object": "list",
                    "data": [{"id": endpoint.model_name, "object": "model"}],
                }
                return self._answer(200, models)
            self._answer(404, {"error": {"message": f"no route {self.path}"}})

        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            self._send(status, "application/json", json.dumps(payload).encode())

        def _send(self, status: int, content_type: str, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # a harness's requests are not news
            pass

    return Handler
