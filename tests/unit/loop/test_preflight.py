"""The numerics preflight: it passes on a correct setup and names the check a broken one fails."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.models import tiny_qwen2

from oncurve.algo.registry import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from oncurve.errors import TrainingError
from oncurve.loop import preflight
from oncurve.loop.preflight import run_preflight
from oncurve.model.char_tokenizer import char_tokenizer
from oncurve.model.forward import PolicyLogprobs
from oncurve.rollout import SamplingParams, build_sampler
from oncurve.update.microbatches import ForwardSettings
from oncurve.update.step import LossFns

FNS = LossFns(
    policy_loss=POLICY_LOSSES["ppo_clip"],
    aggregate=AGGREGATIONS["seq-mean-token-mean"],
    kl=KL_ESTIMATORS["k3"],
    beta=0.04,
    eps_low=0.2,
    eps_high=0.2,
    dual_clip=None,
    norm_len=8.0,
)


def setting(**changes):
    tokenizer = char_tokenizer()
    model = tiny_qwen2(len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    rows = [
        {"prompt": text, "prompt_ids": tokenizer(text)["input_ids"]}
        for text in ("12+34=", "7+8=", "100+1=")
    ]
    arguments = {
        "policy": PolicyLogprobs(model),
        "sampler": build_sampler("auto", model, tokenizer),
        "rows": rows,
        "group_size": 4,
        "params": SamplingParams(max_new_tokens=8, min_new_tokens=8),
        "fns": FNS,
        "trainable": list(model.parameters()),
        "forward": ForwardSettings(temperature=1.0, chunk_size=16, microbatch_rows=4),
        "chat_template": False,
        "dtype": torch.float32,
    }
    return model, {**arguments, **changes}


def test_a_correct_setup_passes_and_leaves_weights_and_gradients_as_they_were():
    model, arguments = setting()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seed_state = torch.get_rng_state()
    lines = run_preflight(**arguments)
    assert len(lines) == 2
    assert lines[0].startswith("preflight: sampler logprobs = training forward's (mean |diff|")
    assert lines[1].startswith("preflight: gradient independent of microbatching")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), seed_state)


def per_microbatch_mean(per_token, mask, **_counts):
    return (per_token * mask).sum() / mask.sum()  # ignores the step's counts


def test_a_loss_normalised_per_microbatch_fails_the_gradient_check():
    _, arguments = setting(fns=dataclasses.replace(FNS, aggregate=per_microbatch_mean))
    with pytest.raises(TrainingError, match="gradient changes by .* when the microbatches"):
        run_preflight(**arguments)


def test_bfloat16s_gradient_tolerance_is_far_below_what_a_loss_normalised_per_microbatch_moves():
    """The bfloat16 tolerance leaves room for rounding, not for the bug it is there for: a
    loss normalised per microbatch moves the gradient by about its own size, 10x the
    tolerance and more, so a bfloat16 run that has it still stops."""
    fns = dataclasses.replace(FNS, aggregate=per_microbatch_mean)
    _, arguments = setting(fns=fns, dtype=torch.bfloat16)
    with pytest.raises(TrainingError, match="gradient changes by") as failed:
        run_preflight(**arguments)
    gap = float(str(failed.value).split("changes by ")[1].split()[0])
    tolerance = preflight.Tolerances.of(torch.bfloat16).gradient
    assert tolerance == 5e-2 and gap > 10 * tolerance, gap


def test_a_sampler_at_another_temperature_fails_the_logprob_check():
    _, arguments = setting(params=SamplingParams(max_new_tokens=8, temperature=0.5))
    with pytest.raises(TrainingError, match="sampler's logprobs differ from the training"):
        run_preflight(**arguments)


def test_a_chat_template_that_loses_the_prompt_fails():
    _, arguments = setting(chat_template=True)
    rows = arguments["rows"]
    rows[1] = {**rows[1], "prompt_ids": rows[1]["prompt_ids"][:-2]}  # the template cut it
    with pytest.raises(TrainingError, match="chat template does not reproduce the prompt '7"):
        run_preflight(**arguments)
    rows[1] = {**rows[1], "prompt": "7+"}
    lines = run_preflight(**arguments)
    assert lines[0] == "preflight: chat template keeps the prompt text (3 prompts)"


@pytest.mark.parametrize("preflight", [True, False])
def test_the_trainer_runs_it_before_step_1_only_when_asked(
    tiny_model_dir, data_file, tmp_path, capsys, monkeypatch, preflight
):
    from helpers.configs import make_config

    import oncurve.loop.trainer

    config = make_config(
        tiny_model_dir, data_file, tmp_path / "run", "run.steps=1", f"run.preflight={preflight}"
    )
    calls = []
    real = oncurve.loop.trainer.run_preflight
    monkeypatch.setattr(
        oncurve.loop.trainer, "run_preflight", lambda **kw: calls.append(kw) or real(**kw)
    )
    oncurve.loop.trainer.train(config, quiet=True)
    err = capsys.readouterr().err
    assert ("preflight: gradient independent of microbatching" in err) is preflight
    assert ("preflight: settings valid, none of them a known silent no-op" in err) is preflight
    if preflight:
        (arguments,) = calls
        assert len(arguments["rows"]) == 2 and arguments["group_size"] == 4
        assert arguments["dtype"] == torch.float32
    else:
        assert calls == []


def test_a_nan_loss_fails_the_gradient_check():
    def nan_aggregate(per_token, mask, **_counts):
        return (per_token * mask).sum() * float("nan")

    _, arguments = setting(fns=dataclasses.replace(FNS, aggregate=nan_aggregate))
    with pytest.raises(TrainingError, match="gradient changes by nan"):
        run_preflight(**arguments)


def test_the_gradient_gap_is_the_whole_gradients_relative_distance_and_keeps_the_grad_tensors(
    monkeypatch,
):
    """Summed parameter by parameter, the gap equals |g_a - g_b| / |g_a| over the whole
    gradient; the parameters keep their own (zeroed) gradient tensors."""
    model, arguments = setting(fns=dataclasses.replace(FNS, beta=0.0))
    params = list(model.parameters())
    for param in params:
        param.grad = torch.zeros_like(param)
    grads = [param.grad for param in params]
    seen: list[torch.Tensor] = []
    real = preflight.accumulate_gradients

    def recording(*args, **kwargs):
        real(*args, **kwargs)
        seen.append(torch.cat([p.grad.double().flatten() for p in params]))

    monkeypatch.setattr(preflight, "accumulate_gradients", recording)
    captured = {}
    real_gap = preflight.gradient_split_gap

    def keep(*args, **kwargs):
        captured["gap"] = real_gap(*args, **kwargs)
        return captured["gap"]

    monkeypatch.setattr(preflight, "gradient_split_gap", keep)
    run_preflight(**arguments)
    a, b = seen
    assert float(a.norm()) > 0
    expected = float((a - b).norm() / a.norm())
    assert captured["gap"] == pytest.approx(expected, rel=1e-6, abs=1e-12)
    assert all(
        param.grad is grad and not grad.any() for param, grad in zip(params, grads, strict=True)
    )
