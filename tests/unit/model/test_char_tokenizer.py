"""The bundled model's character tokenizer encodes every character, spaces and newlines too, to
the ids it was trained with, however it is loaded: built, from the bundled directory, and from a
directory it was saved to (a run's final/) by `transformers` alone."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from oncurve.model.char_tokenizer import char_tokenizer
from oncurve.model.sources import load_tokenizer, resolve_model_path

TEXT = "12 + 34 =\n\t<answer> 46 </answer>"


def test_the_bundled_tokenizer_loads_with_the_ids_it_was_trained_with(tmp_path):
    built = char_tokenizer()
    ids = built(TEXT)["input_ids"]
    assert len(ids) == 1 + len(TEXT) and built.decode(ids, skip_special_tokens=True) == TEXT
    loaded = load_tokenizer(resolve_model_path("default"))
    assert loaded(TEXT)["input_ids"] == ids
    assert loaded.decode(ids, skip_special_tokens=True) == TEXT
    loaded.save_pretrained(tmp_path)  # as final/ is written
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(TEXT)["input_ids"] == ids
    assert again.decode(ids, skip_special_tokens=True) == TEXT


def test_characters_beyond_one_byte_are_refused():
    with pytest.raises(ValueError, match="must be ASCII"):
        char_tokenizer("abé")
