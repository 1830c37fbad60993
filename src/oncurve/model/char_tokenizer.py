"""A character-level tokenizer for the bundled model: one token per printable ASCII character.

Built with `tokenizers` (a BPE model without merges is a character lookup) and wrapped as a
`transformers.PreTrainedTokenizerFast`, so `AutoTokenizer.from_pretrained(dir)` loads the saved
`tokenizer.json` + `tokenizer_config.json` offline. Encoding a text adds `<bos>` in front; the
trainer's prompts start with it, and so do the warm-start examples.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Printable ASCII without the vertical tab and form feed: every character a prompt is likely to
# hold, so that `oncurve sample --prompt "..."` on the bundled model never meets `<unk>`.
CHARS = "".join(c for c in string.printable if c not in "\x0b\x0c")


def char_tokenizer(chars: str = CHARS) -> PreTrainedTokenizerFast:
    """Special tokens take ids 0-3 (pad, bos, eos, unk), then one id per character of `chars`."""
    if len(set(chars)) != len(chars):
        raise ValueError("char_tokenizer: chars must not repeat a character")
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({c: len(SPECIAL_TOKENS) + i for i, c in enumerate(chars)})
    # No pre-tokenizer: the whole text is one "word" that BPE splits into characters, so spaces
    # and newlines are ordinary tokens and decoding is plain concatenation.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.add_special_tokens(list(SPECIAL_TOKENS))
    core.decoder = decoders.Fuse()
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
