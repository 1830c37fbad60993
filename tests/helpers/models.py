"""Tiny random models and the char tokenizer that tests across the suite build, sample and
train: `make_model` of each architecture (with `TOKENIZER`'s `VOCAB`), `tiny_qwen2` of any
vocabulary, `model_of` (adds Qwen3), `lora_model`, and `with_own_code` (a model directory that
ships code)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from oncurve.model.char_tokenizer import char_tokenizer

TOKENIZER = char_tokenizer()
VOCAB = len(TOKENIZER)
EOS = TOKENIZER.eos_token_id
PROMPTS = ["12+34=", "x", "hello world"]


def make_model(
    kind: str, eos_bias: float | None = None, hidden: int = 32
) -> transformers.PreTrainedModel:
    """A random ~30k-parameter model (at `hidden` 32); `eos_bias` adds an lm_head bias on EOS
    only."""
    torch.manual_seed(0)
    sizes = dict(hidden_size=hidden, intermediate_size=2 * hidden)
    common = dict(vocab_size=VOCAB, **sizes, num_hidden_layers=2)
    heads = dict(num_attention_heads=4, max_position_embeddings=128)
    if kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(
            transformers.Qwen2Config(**common, **heads, num_key_value_heads=2)
        )
    elif kind == "llama":
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(**common, **heads, num_key_value_heads=4)
        )
    elif kind == "mistral":
        model = transformers.MistralForCausalLM(
            transformers.MistralConfig(**common, **heads, num_key_value_heads=1)
        )
    else:
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128
        )
        model = transformers.GPT2LMHeadModel(config)
    model.config.eos_token_id = EOS
    model.generation_config.eos_token_id = EOS
    if eos_bias is not None:
        old = model.get_output_embeddings()
        head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
        with torch.no_grad():
            head.weight.copy_(old.weight)
            head.bias.zero_()
            head.bias[EOS] = eos_bias
        model.set_output_embeddings(head)
    return model.eval()


def tiny_qwen2(vocab_size: int, seed: int = 0) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


def qwen3_model() -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
    )  # fmt: skip
    model = transformers.Qwen3ForCausalLM(config)
    model.config.eos_token_id = model.generation_config.eos_token_id = EOS
    return model.eval()


def model_of(kind: str) -> transformers.PreTrainedModel:
    return qwen3_model() if kind == "qwen3" else make_model(kind)


def lora_model() -> torch.nn.Module:
    peft = pytest.importorskip("peft", reason="the lora extra (peft) is not installed")
    adapted = peft.get_peft_model(
        make_model("qwen2"),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]),
    )
    return adapted.get_base_model()


def with_own_code(model_dir: Path, dest: Path, marker: Path) -> None:
    """A copy of `model_dir` at `dest` whose config.json names model code of its own
    (`auto_map`): `custom.py`, which creates the file `marker` when it runs."""
    shutil.copytree(model_dir, dest)
    settings = json.loads((dest / "config.json").read_text())
    settings["auto_map"] = {"AutoConfig": "custom.MyConfig", "AutoModelForCausalLM": "custom.M"}
    (dest / "config.json").write_text(json.dumps(settings))
    (dest / "custom.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
