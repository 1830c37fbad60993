"""`oncurve sample`: completions of one prompt."""

from __future__ import annotations

import argparse
import json

from oncurve.cli.common import (
    fitted_new_tokens,
    load_sampler,
    print_out,
    prompt_format,
    run_config,
    sampling,
    seed_of,
)


def sample_command(args: argparse.Namespace) -> int:
    from oncurve.data.prompts import encode_prompt

    config, config_file = run_config(args)
    chosen = sampling(args, config, config_file)
    sampler, model = load_sampler(args, config, config_file)
    data = prompt_format(args, config, sampler.tokenizer)
    ids = encode_prompt(sampler.tokenizer, args.prompt, data, "--prompt")
    max_new_tokens = fitted_new_tokens(chosen, len(ids), model.config)
    params = chosen.params(max_new_tokens, seed_of(args, config))
    batch = sampler.generate_ids([ids], args.n, params)
    for text, reason in zip(batch.texts, batch.finish_reasons, strict=True):
        print_out(json.dumps({"completion": text, "finish_reason": reason}))
    return 0
