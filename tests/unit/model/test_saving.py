"""The generation config a run's final model is saved with: the base model's special tokens
and the sampling the run trained with, nothing else of the base's."""

from __future__ import annotations

import transformers
from helpers.models import tiny_qwen2

from oncurve.model.saving import trained_generation


def test_the_final_generation_config_is_the_runs_sampling_and_the_base_models_tokens():
    model = tiny_qwen2(64)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=1,
        eos_token_id=[2, 3],
        pad_token_id=0,
        do_sample=True,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
        # logits processors training never applied: `generate` on the final model must not
        repetition_penalty=1.1,
        no_repeat_ngram_size=3,
        bad_words_ids=[[5]],
    )
    sampled = trained_generation(
        model, max_new_tokens=16, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0
    ).to_diff_dict()
    sampled.pop("transformers_version", None)
    assert sampled == {
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "pad_token_id": 0,
        "do_sample": True,
        "max_new_tokens": 16,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
    }
    greedy = trained_generation(
        model, max_new_tokens=8, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0
    ).to_diff_dict()
    greedy.pop("transformers_version", None)
    assert greedy == {
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "pad_token_id": 0,
        "do_sample": False,
        "max_new_tokens": 8,
    }
