"""`oncurve sample`: completions of one prompt."""

from __future__ import annotations

import argparse
import json

from oncurve.cli.common import load_sampler, prompt_format, run_config


def sample_command(args: argparse.Namespace) -> int:
    from oncurve.data.prompts import encode_prompt
    from oncurve.rollout import SamplingParams
    from oncurve.rollout.base import check_room

    config = run_config(args)
    sampler, model = load_sampler(args, config)
    data = prompt_format(args, config, sampler.tokenizer)
    ids = encode_prompt(sampler.tokenizer, args.prompt, data, "--prompt")
    check_room(len(ids), args.max_new_tokens, model.config, "--max-new-tokens")
    params = SamplingParams(args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    batch = sampler.generate_ids([ids], args.n, params)
    for text, reason in zip(batch.texts, batch.finish_reasons, strict=True):
        print(json.dumps({"completion": text, "finish_reason": reason}))
    return 0
