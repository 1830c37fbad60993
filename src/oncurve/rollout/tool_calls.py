"""Tool calls in the formats chat templates teach, read from a completion into OpenAI's
`tool_calls` as vLLM's parsers of those formats read them, and an assistant message that holds
them keyed by what it says, so that the endpoint recognises a turn it sampled when a harness
sends it back. The formats (`tool_call_format` tells a tokenizer's):

- `HERMES`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as Qwen2.5's, Qwen3's
  and the Hermes models' templates write a call (vLLM's `hermes` parser);
- `LLAMA3_JSON`: a bare `{"name": ..., "parameters": {...}}` (or `"arguments"`), as Llama 3.1's,
  3.2's and 3.3's Instruct templates write a call (vLLM's `llama3_json` parser).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

HERMES, LLAMA3_JSON = "hermes", "llama3_json"
OPEN = "<tool_call>"
CLOSE = "</tool_call>"
# a Llama 3 template's system turn header, and how it writes an assistant's call
_LLAMA3_HEADER, _LLAMA3_CALL = "<|start_header_id|>", '"parameters": '

# where a completion's first call starts and each call's name and arguments; None: no call, or
# one that is not a call (a format's reader)
Read = tuple[int, list[tuple[str, Any]]] | None


def tool_call_format(tokenizer: Any) -> str | None:
    """The format `tokenizer`'s chat template shows tools and writes calls in (`HERMES`,
    `LLAMA3_JSON`; any of its named templates), None for none of these."""
    template = getattr(tokenizer, "chat_template", None) or ""
    templates = template.values() if isinstance(template, dict) else [template]
    for text in templates:
        if "tools" not in text:
            continue
        if OPEN in text:
            return HERMES
        if _LLAMA3_HEADER in text and _LLAMA3_CALL in text:
            return LLAMA3_JSON
    return None


def parse_tool_calls(
    text: str, call_id: str, format: str = HERMES
) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a completion whose calls are in `format`: its text before the
    first call (None when empty) and each call as OpenAI writes one (`arguments` a JSON string,
    ids `call_id`-k). A call that is not a JSON object with a name (or is JSON that `json`
    cannot read: nested past its recursion, a number too long for `int`) leaves the whole text
    as content and no call, as vLLM does: the policy's malformed call is its own answer to be
    scored. ValueError for a format not in `FORMATS`."""
    if format not in FORMATS:
        raise ValueError(f"format: {format!r} is not one of {sorted(FORMATS)}")
    found = FORMATS[format](text)
    if not found:
        return text, []
    start, named = found
    calls = [
        {
            "id": f"{call_id}-{k}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        for k, (name, arguments) in enumerate(named)
    ]
    return text[:start].strip() or None, calls


def _hermes(text: str) -> Read:
    """Each `<tool_call>` body's JSON object: a name, and arguments ({} where absent)."""
    found = _call_spans(text)
    if not found:
        return None
    calls = []
    for _, body in found:
        call = _json(body)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        calls.append((call["name"], call.get("arguments", {})))
    return found[0][0], calls


def _llama3_json(text: str) -> Read:
    """Every JSON object from the first `{` on, one after another (apart, `;` or other text
    between them is not read, as vLLM's `llama3_json` leaves it): each a call, with a name and
    its `arguments` or `parameters` (`<|python_tag|>` before a call is a special token, left
    out of the decoded text)."""
    decoder = json.JSONDecoder()
    calls: list[tuple[str, Any]] = []
    first = position = text.find("{")
    while (start := text.find("{", position)) != -1:
        try:
            call, position = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        key = "arguments" if "arguments" in call else "parameters"
        if key not in call:
            return None
        calls.append((call["name"], call[key]))
    return (first, calls) if calls else None


def _json(body: str) -> Any:
    """`body` read as JSON; None where `json` cannot read it (nested past its recursion, a
    number too long for `int` included)."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None


FORMATS: dict[str, Callable[[str], Read]] = {HERMES: _hermes, LLAMA3_JSON: _llama3_json}


def _call_spans(text: str) -> list[tuple[int, str]]:
    """(start, body stripped of whitespace) of each `<tool_call>...</tool_call>` in `text`, a
    call ending at the first closing tag after its opening one. Found with `str.find`, in time
    linear in the text (a regex matching whitespace around a lazy body backtracks in cubic time
    on an opening tag followed by a long run of whitespace and no closing tag)."""
    spans = []
    position = 0
    while (start := text.find(OPEN, position)) != -1:
        end = text.find(CLOSE, start + len(OPEN))
        if end == -1:  # no closing tag after this opening one, so none after any later one
            break
        spans.append((start, text[start + len(OPEN) : end].strip()))
        position = end + len(CLOSE)
    return spans


def reply_key(content: Any, tool_calls: Any) -> Any:
    """What identifies an assistant message: its text alone, or with tool calls its text and
    each call's id (unique to the completion that made it), name and arguments (parsed, so
    that a client's re-serialising does not count)."""
    if not tool_calls:
        return content
    calls = []
    for call in tool_calls:
        call = call if isinstance(call, dict) else {}
        function = call.get("function") or {}
        calls.append([call.get("id"), function.get("name"), _parsed(function.get("arguments"))])
    return json.dumps([content or "", calls], sort_keys=True)


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with OpenAI's tool calls as chat templates read them: arguments as
    a mapping where they parse, and text content ("" for none)."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = dict(call.get("function", {}))
        function["arguments"] = _parsed(function.get("arguments"))
        calls.append({**call, "function": function})
    return {**message, "content": message.get("content") or "", "tool_calls": calls}


def _parsed(arguments: Any) -> Any:
    """A call's arguments as a mapping when they are JSON text of one, else as they are (text
    `json` cannot read, nested past its recursion or with a number too long for `int`,
    included)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
    return arguments
