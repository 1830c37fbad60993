"""Tool calls per format: which format a chat template writes, and a completion's calls read
as OpenAI's `tool_calls`."""

from __future__ import annotations

import json
import types

import pytest
from helpers.episodes import load_qwen3_tokenizer
from helpers.paths import FIXTURES

from oncurve.rollout.tool_calls import HERMES, LLAMA3_JSON, parse_tool_calls, tool_call_format

TEMPLATES = FIXTURES / "chat_templates"


def _template(name: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(chat_template=(TEMPLATES / name).read_text())


def test_the_format_is_the_chat_template_s():
    """Qwen3's template writes Hermes calls, Llama 3.1's JSON ones; Mistral's (`[TOOL_CALLS]`,
    a special token) and a template without tools write none this module reads."""
    assert tool_call_format(load_qwen3_tokenizer()) == HERMES
    assert tool_call_format(_template("llama3.1-instruct.jinja")) == LLAMA3_JSON
    assert tool_call_format(_template("mistral-7b-instruct-v0.3.jinja")) is None
    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert tool_call_format(types.SimpleNamespace(chat_template=plain)) is None
    assert tool_call_format(types.SimpleNamespace(chat_template=None)) is None
    llama = _template("llama3.1-instruct.jinja").chat_template
    named = {"default": plain, "tool_use": llama}  # a tokenizer's named templates
    assert tool_call_format(types.SimpleNamespace(chat_template=named)) == LLAMA3_JSON


CALL = '{"name": "f", "parameters": {"x": 1}}'


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("no call", "no call", []),
        (CALL, None, [("f", {"x": 1})]),
        ('{"name": "f", "arguments": {"x": 1}}', None, [("f", {"x": 1})]),
        (' \n{"name":"f","parameters":{}} ', None, [("f", {})]),
        # several calls, as vLLM's llama3_json reads them: `;`-separated or one after another
        (CALL + '; {"name": "g", "parameters": {"y": [1, {"z": 2}]}}', None,
         [("f", {"x": 1}), ("g", {"y": [1, {"z": 2}]})]),
        (CALL + "\n" + CALL, None, [("f", {"x": 1}), ("f", {"x": 1})]),
        # text before the first call is the content; braces inside a call's strings are its own
        ("Let me add.\n" + CALL, "Let me add.", [("f", {"x": 1})]),
        ('{"name": "f", "parameters": {"s": "a } { b"}}', None, [("f", {"s": "a } { b"})]),
        # anything that is not a call leaves the whole text as content, no call
        ("The set {1, 2}.", None, None),
        ('{"a": 1}', None, None),
        ('{"name": "f"}', None, None),
        ('{"name": 3, "parameters": {}}', None, None),
        (CALL + ' then {"x": 1}', None, None),
        (CALL + " then {oops}", None, None),
        ('{"name": "f", "parameters": {"x": 1}', None, None),
        # JSON too deep for the parser's recursion, or a number too long for int(): text
        ('{"name": "f", "parameters": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}",
         None, None),
        ('{"name": "f", "parameters": {"x": ' + "9" * 5000 + "}}", None, None),
    ],
)  # fmt: skip
def test_parse_llama3_json_tool_calls(text, content, calls):
    _check_parse(text, LLAMA3_JSON, content, calls)


def _check_parse(text: str, format: str, content: str | None, calls: list | None) -> None:
    """`text` read in `format` gives `content` and `calls` (name, arguments) with ids
    `call_x-k`; `calls` None: no call, the whole text the content."""
    got_content, got_calls = parse_tool_calls(text, "call_x", format)
    if calls is None:
        assert (got_content, got_calls) == (text, [])
        return
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got_calls] \
        == calls  # fmt: skip
    assert [c["id"] for c in got_calls] == [f"call_x-{k}" for k in range(len(calls))]
    assert all(c["type"] == "function" for c in got_calls)


def test_long_llama3_json_texts_parse_whole():
    """200,000 braces that open no call are text; 20,000 calls in a row are each read, from
    where the one before ended (a reader copying the text after each call would copy
    gigabytes)."""
    braces = "{" * 200_000
    assert parse_tool_calls(braces, "c", LLAMA3_JSON) == (braces, [])
    many = "; ".join([CALL] * 20_000)
    content, calls = parse_tool_calls(many, "c", LLAMA3_JSON)
    assert content is None and len(calls) == 20_000


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="format: 'xml'"):
        parse_tool_calls(CALL, "c", "xml")


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("no call", "no call", []),
        ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', None, [("f", {"x": 1})]),
        ('Two.\n<tool_call>{"name": "f"}</tool_call><tool_call>{"name": "g", "arguments": '
         '{}}</tool_call> done', "Two.", [("f", {}), ("g", {})]),
        # one call that does not parse: the whole text is the answer, as vLLM leaves it
        ('<tool_call>{"name": "f"}</tool_call><tool_call>{name: g}</tool_call>', None, None),
        ('<tool_call>["f"]</tool_call>', None, None),
        ('<tool_call>{"arguments": {}}</tool_call>', None, None),
        # whitespace around a call is not the call's; a call ends at its first closing tag
        (' A <tool_call>\n {"name": "f"} \t\n</tool_call>', "A", [("f", {})]),
        ('<tool_call><tool_call>{"name": "f"}</tool_call>', None, None),
        ('<tool_call>{"name": "f"}</tool_call></tool_call>', None, [("f", {})]),
        # JSON too deep for the parser's recursion, or a number too long for int(): text
        ('<tool_call>{"name": "f", "arguments": {"x": ' + "[" * 100_000 + "]" * 100_000
         + "}}</tool_call>", None, None),
        ('<tool_call>{"name": "f", "arguments": {"x": ' + "9" * 5000 + "}}</tool_call>",
         None, None),
    ],
)  # fmt: skip
def test_parse_hermes_tool_calls(text, content, calls):
    _check_parse(text, HERMES, content, calls)


def test_tool_calls_around_long_whitespace_parse_in_linear_time():
    """An opening tag followed by 20,000 spaces and no closing tag is text, not a call (a
    backtracking regex takes cubic time on it); the whitespace around a call's JSON is not part
    of it, however long."""
    spaces = " " * 20_000
    for text in ("<tool_call>" + spaces, "<tool_call>{" + spaces, "<tool_call>" + spaces + "x"):
        assert parse_tool_calls(text, "c") == (text, [])
    text = f'Hi.<tool_call>{spaces}{{"name": "f"}}\n{spaces}</tool_call><tool_call>{spaces}'
    content, calls = parse_tool_calls(text, "c")
    assert content == "Hi." and [c["function"]["name"] for c in calls] == ["f"]
