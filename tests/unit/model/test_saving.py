"""The generation config a run's final model is saved with: the base model's special tokens
and the sampling the run trained with, nothing else of the base's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import transformers
from helpers.models import tiny_qwen2

from oncurve.model import saving
from oncurve.model.char_tokenizer import char_tokenizer
from oncurve.model.saving import trained_generation

TOKENS = {"bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": 0}


def test_the_final_generation_config_is_the_runs_sampling_and_the_base_models_tokens():
    model = tiny_qwen2(64)
    # logits processors training never applied, which `generate` on the final model must not
    processors = {"repetition_penalty": 1.1, "no_repeat_ngram_size": 3, "bad_words_ids": [[5]]}
    model.generation_config = transformers.GenerationConfig(
        **TOKENS, do_sample=True, temperature=0.7, top_p=0.8, top_k=20, **processors
    )

    def saved(max_new_tokens: int, temperature: float) -> dict:
        generation = trained_generation(
            model, char_tokenizer(), max_new_tokens=max_new_tokens, temperature=temperature,
            top_p=1.0, top_k=0, min_p=0.0,
        )  # fmt: skip
        return {k: v for k, v in generation.to_diff_dict().items() if k != "transformers_version"}

    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    assert saved(16, 1.0) == {**TOKENS, "do_sample": True, "max_new_tokens": 16, **sampling}
    assert saved(8, 0.0) == {**TOKENS, "do_sample": False, "max_new_tokens": 8}


@pytest.mark.parametrize(
    ("stated", "eos", "pad"),
    [({}, 2, 0), ({"eos_token_id": 5, "pad_token_id": 7}, [5, 2], 7), (TOKENS, [2, 3], 0)],
)
def test_the_final_generation_config_stops_where_the_run_stopped(stated, eos, pad):
    """The run's completions end at the tokenizer's EOS (2) as well as at the model's own (the
    sampler stops at both), and are padded with its pad token (0): `generate` on the final
    model stops at every one of them, also where the base states none."""
    model = tiny_qwen2(64)
    model.generation_config = transformers.GenerationConfig(**stated)
    generation = trained_generation(
        model, char_tokenizer(), max_new_tokens=8, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0
    )
    assert (generation.eos_token_id, generation.pad_token_id) == (eos, pad)


def test_the_final_model_is_on_the_disk_before_its_name_is(tmp_path, monkeypatch):
    """Every file of `final/` is flushed to the disk before the directory is renamed into place,
    and the rename after it: a power loss leaves the previous final model or the whole new one,
    never a `final/` of empty files."""
    events: list[tuple[str, str]] = []
    real_replace = os.replace

    def replace(src, dst) -> None:
        events.append(("rename", Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(saving, "fsync", lambda path: events.append(("fsync", str(path))))
    monkeypatch.setattr(saving.os, "replace", replace)
    model = tiny_qwen2(64)
    generation = trained_generation(
        model, char_tokenizer(), max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0
    )
    out = tmp_path / "final"
    saving.save_final(model, char_tokenizer(), out, generation)
    renamed = events.index(("rename", "final"))
    flushed = {Path(path).name for kind, path in events[:renamed] if kind == "fsync"}
    files = {p.name for p in out.iterdir()}
    assert "model.safetensors" in files and files <= flushed
    assert events[renamed - 1] == ("fsync", str(tmp_path / f".final.partial-{os.getpid()}"))
    assert events[renamed + 1 :] == [("fsync", str(tmp_path))]


def _save(out: Path) -> None:
    model = tiny_qwen2(64)
    generation = trained_generation(
        model, char_tokenizer(), max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0
    )
    saving.save_final(model, char_tokenizer(), out, generation)


def test_saving_final_again_keeps_the_users_files_and_drops_the_previous_saves_own(tmp_path):
    """As `save_pretrained` into a folder keeps what it does not write: a model card, an eval
    result, a link put in final/ are in the new one; the previous save's weight shards and
    adapter, which this save does not write, are not (an index left beside them would load
    the stale shards)."""
    out = tmp_path / "final"
    _save(out)
    mine = {"README.md": "my card", "eval_results.json": "{}", "evals/gsm8k.jsonl": "{}\n"}
    for name, text in mine.items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(text)
    (out / "card").symlink_to("README.md")
    stale = ["model-00001-of-00002.safetensors", "model.safetensors.index.json"]
    stale += ["adapter/adapter_model.safetensors", "adapter/adapter_config.json"]
    for name in stale:
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text("{}")
    _save(out)
    assert {name: (out / name).read_text() for name in mine} == mine
    assert os.readlink(out / "card") == "README.md"
    assert not any((out / name).exists() for name in [*stale, "adapter"])
    assert saving.missing_from_final(out) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_a_final_that_is_a_link_stays_one_and_the_model_goes_where_it_points(tmp_path):
    """final/ linked to a larger disk: the save replaces the directory it points to, whole or
    not at all, beside it, and the link is left as the user made it."""
    disk = tmp_path / "disk" / "run-final"
    disk.mkdir(parents=True)
    (disk / "README.md").write_text("my card")
    out = tmp_path / "run" / "final"
    out.parent.mkdir()
    out.symlink_to(disk)
    for _ in range(2):
        _save(out)
        assert out.is_symlink() and out.resolve() == disk.resolve()
        assert saving.missing_from_final(disk) is None
        assert (disk / "README.md").read_text() == "my card"
        assert sorted(p.name for p in disk.parent.iterdir()) == ["run-final"]
        assert sorted(p.name for p in out.parent.iterdir()) == ["final"]
