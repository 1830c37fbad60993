"""Tool calls in the Hermes format that Qwen2.5, Qwen3 and the Hermes models' chat templates
teach (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), read from a completion into
OpenAI's `tool_calls` as vLLM's `hermes` parser reads them, and an assistant message that holds
them keyed by what it says, so that the endpoint recognises a turn it sampled when a harness
sends it back."""

from __future__ import annotations

import json
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def supports_tool_calls(tokenizer: Any) -> bool:
    """Whether `tokenizer`'s chat template shows tools and writes calls in the Hermes format."""
    template = getattr(tokenizer, "chat_template", None) or ""
    templates = template.values() if isinstance(template, dict) else [template]
    return any(OPEN in text and "tools" in text for text in templates)


def parse_tool_calls(text: str, call_id: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a completion: its text before the first call (None when
    empty) and each call as OpenAI writes one (`arguments` a JSON string, ids `call_id`-k).
    A call that is not a JSON object with a name (or is JSON that `json` cannot read: nested
    past its recursion, a number too long for `int`) leaves the whole text as content and no
    call, as vLLM does: the policy's malformed call is its own answer to be scored."""
    found = _call_spans(text)
    if not found:
        return text, []
    calls = []
    for k, (_, body) in enumerate(found):
        try:
            call = json.loads(body)
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return text, []
            arguments = json.dumps(call.get("arguments", {}))
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
            return text, []
        calls.append(
            {
                "id": f"{call_id}-{k}",
                "type": "function",
                "function": {"name": call["name"], "arguments": arguments},
            }
        )
    content = text[: found[0][0]].strip()
    return content or None, calls


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
