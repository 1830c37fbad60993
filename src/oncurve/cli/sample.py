"""`oncurve sample`: completions of one prompt."""

from __future__ import annotations

import argparse
import json

from oncurve.cli.common import fitted_new_tokens, load_sampler, prompt_format, run_config, sampling


def sample_command(args: argparse.Namespace) -> int:
    from oncurve.data.prompts import encode_prompt
    from oncurve.rollout import SamplingParams

    config, config_file = run_config(args)
    chosen = sampling(args, config, config_file)
    sampler, model = load_sampler(args, config)
    data = prompt_format(args, config, sampler.tokenizer)
    ids = encode_prompt(sampler.tokenizer, args.prompt, data, "--prompt")
    params = SamplingParams(
        fitted_new_tokens(chosen, len(ids), model.config),
        temperature=chosen.temperature,
        top_p=chosen.top_p,
        top_k=chosen.top_k,
        min_p=chosen.min_p,
        seed=args.seed,
    )
    batch = sampler.generate_ids([ids], args.n, params)
    for text, reason in zip(batch.texts, batch.finish_reasons, strict=True):
        print(json.dumps({"completion": text, "finish_reason": reason}))
    return 0
