"""What a resume does with settings that differ from its checkpoint's."""

from __future__ import annotations

import pytest

from oncurve.config import load_config
from oncurve.config.resume_settings import refusal


@pytest.mark.parametrize(
    ("saved", "given"),
    [
        ("You are a tutor.\nThink step by step.", "You are a tutor."),
        ("tab\there", None),
    ],
)
def test_a_refused_text_setting_is_one_line_whose_override_restores_it(saved, given) -> None:
    """The suggested override of a text with a line break or a tab is quoted: the refusal
    stays one line, and the override gives the saved text back."""
    why = refusal({"data.system_prompt": [saved, given]}, 2, 4, (None, None))
    assert why is not None and "\n" not in why and "\t" not in why
    suggested = why.split("resume with data.system_prompt=", 1)[1].split(", force it")[0]
    restored = load_config(None, [f"data.system_prompt={suggested}"])
    assert restored.data.system_prompt == saved


def test_a_plain_text_setting_is_suggested_as_it_is() -> None:
    why = refusal({"data.path": ["data/train.jsonl", "other.jsonl"]}, 2, 4, (None, None))
    assert "resume with data.path=data/train.jsonl, force it" in why


def test_changed_chat_template_kwargs_are_refused_as_data_settings() -> None:
    """They change every prompt's tokens, as data.chat_template does: refused, forceable."""
    from oncurve.config import to_dict
    from oncurve.config.resume_settings import changed_settings

    saved = to_dict(load_config(None, ["data.chat_template=true"]))
    thinking = ["data.chat_template=true", "data.chat_template_kwargs.enable_thinking=false"]
    changes = changed_settings(saved, to_dict(load_config(None, thinking)))
    assert changes == {"data.chat_template_kwargs.enable_thinking": [None, False]}
    why = refusal(changes, 2, 4, (None, None))
    assert why is not None and why.startswith("data.chat_template_kwargs.enable_thinking was None")
    assert "run.force_changes=[data.chat_template_kwargs.enable_thinking]" in why
