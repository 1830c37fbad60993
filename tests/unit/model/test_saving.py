"""The generation config a run's final model is saved with: the base model's special tokens
and the sampling the run trained with, nothing else of the base's."""

from __future__ import annotations

import transformers
from helpers.models import tiny_qwen2

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
            model, max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, top_k=0,
            min_p=0.0,
        )  # fmt: skip
        return {k: v for k, v in generation.to_diff_dict().items() if k != "transformers_version"}

    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    assert saved(16, 1.0) == {**TOKENS, "do_sample": True, "max_new_tokens": 16, **sampling}
    assert saved(8, 0.0) == {**TOKENS, "do_sample": False, "max_new_tokens": 8}
