"""A character-level tokenizer for the bundled model: one token per printable ASCII character.

Built with `tokenizers` (a BPE model without merges is a character lookup) and wrapped as a
`transformers.PreTrainedTokenizerFast`, so `AutoTokenizer.from_pretrained(dir)` loads the saved
`tokenizer.json` + `tokenizer_config.json` offline. Encoding a text adds `<bos>` in front; the
trainer's prompts start with it, and so do the warm-start examples.

Its vocabulary names each character as byte-level BPE does (a space is `Ġ`, a newline `Ċ`), with
a byte-level pre-tokenizer and decoder: `AutoTokenizer` loads a directory whose model is a Qwen2
as the Qwen2 tokenizer, which builds that byte-level pipeline around the vocabulary whatever
`tokenizer.json` says, and it then encodes every character to the same id as this one.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Printable ASCII without the vertical tab and form feed: every character a prompt is likely to
# hold, so that `oncurve sample --prompt "..."` on the bundled model never meets `<unk>`.
CHARS = "".join(c for c in string.printable if c not in "\x0b\x0c")


def char_tokenizer(chars: str = CHARS) -> PreTrainedTokenizerFast:
    """Special tokens take ids 0-3 (pad, bos, eos, unk), then one id per character of `chars`."""
    if len(set(chars)) != len(chars):
        raise ValueError("char_tokenizer: chars must not repeat a character")
    byte_char = bytes_to_unicode()
    if any(ord(c) > 127 for c in chars):
        raise ValueError("char_tokenizer: chars must be ASCII (one byte each)")
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({byte_char[ord(c)]: len(SPECIAL_TOKENS) + i for i, c in enumerate(chars)})
    # Without merges BPE splits the text into characters: spaces and newlines are ordinary
    # tokens (as their byte-level names), and decoding maps the names back.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.add_special_tokens(list(SPECIAL_TOKENS))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
