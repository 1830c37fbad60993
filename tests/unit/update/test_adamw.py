"""AdamW with stochastic rounding for bfloat16 weights."""

from __future__ import annotations

import pytest
import torch

import oncurve.update.adamw
from oncurve.update.adamw import AdamW, stochastic_round


def test_stochastic_rounding_picks_a_neighbour_with_the_right_odds():
    low = torch.tensor(1.0, dtype=torch.bfloat16)  # bfloat16 spacing at 1.0 is 2^-7
    value = torch.full((200_000,), 1.0 + 0.3 * 2**-7)
    rounded = stochastic_round(value, torch.Generator().manual_seed(0)).float()
    assert set(rounded.unique().tolist()) == {1.0, 1.0 + 2**-7}
    up = float((rounded > low.float()).float().mean())
    assert abs(up - 0.3) < 0.005  # 0.3 +- 4.5 standard errors
    assert abs(float(rounded.mean()) - float(value[0])) < 2e-5
    # exact values, negatives, zero and infinities come back as they were
    exact = torch.tensor([0.0, -2.5, 3.0, 2**-7, float("inf"), float("-inf")])
    assert torch.equal(stochastic_round(exact, torch.Generator()).float(), exact)
    # negatives round in magnitude with the same odds
    negative = stochastic_round(-value, torch.Generator().manual_seed(0)).float()
    assert torch.equal(negative, -rounded)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_float32_parameters_step_exactly_as_torchs_adamw(weight_decay):
    torch.manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(300, 7))
    theirs = torch.nn.Parameter(ours.detach().clone())
    kwargs = {"lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": weight_decay}
    opt_ours, opt_theirs = AdamW([ours], **kwargs), torch.optim.AdamW([theirs], **kwargs)
    for _ in range(5):
        grad = torch.randn(300, 7)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        opt_ours.step()
        opt_theirs.step()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    state = opt_ours.state[ours]
    torch.testing.assert_close(state["exp_avg_sq"], opt_theirs.state[theirs]["exp_avg_sq"])


def test_small_bfloat16_updates_add_up_where_rounding_to_nearest_loses_them(monkeypatch):
    """lr 1e-5 on weights near 0.5 (bfloat16 spacing 2^-9 = 2e-3): 100 steps against a gradient
    of constant sign move a float32 weight by 1e-3. Rounded to nearest, bfloat16 weights never
    move; stochastically rounded, they move by that much on average."""
    import oncurve.update.adamw

    monkeypatch.setattr(oncurve.update.adamw, "SLICE", 1000)  # several slices per parameter
    start = torch.full((4096,), 0.5)
    exact = torch.nn.Parameter(start.clone())
    ours = torch.nn.Parameter(start.clone().bfloat16())
    nearest = torch.nn.Parameter(start.clone().bfloat16())
    kwargs = {"lr": 1e-5, "betas": (0.9, 0.99), "weight_decay": 0.0}
    optimizers = [
        torch.optim.AdamW([exact], **kwargs),
        AdamW([ours], seed=3, **kwargs),
        torch.optim.AdamW([nearest], **kwargs),
    ]
    for _ in range(100):
        for param, opt in zip((exact, ours, nearest), optimizers, strict=True):
            param.grad = torch.ones_like(param)
            opt.step()
    moved = 0.5 - float(exact.detach().mean())
    assert moved == pytest.approx(1e-3, rel=0.01)
    assert torch.equal(nearest.float(), start)
    assert 0.5 - float(ours.detach().float().mean()) == pytest.approx(moved, rel=0.05)


def test_bfloat16_steps_repeat_for_a_seed_and_resume_from_a_state_dict():
    def run(steps: int, seed: int, resume_from: dict | None = None, start: torch.Tensor = None):
        param = torch.nn.Parameter(start.clone())
        opt = AdamW([param], lr=1e-4, seed=seed)
        if resume_from is not None:
            opt.load_state_dict(resume_from)
        for i in range(steps):
            param.grad = torch.sin(torch.arange(1000.0) + i).bfloat16()
            opt.step()
        return param.detach().clone(), opt.state_dict()

    start = torch.linspace(-1, 1, 1000).bfloat16()
    straight, _ = run(4, seed=1, start=start)
    again, _ = run(4, seed=1, start=start)
    other, _ = run(4, seed=2, start=start)
    assert torch.equal(straight, again) and not torch.equal(straight, other)
    half, state = run(2, seed=1, start=start)
    # the resumed optimizer sees gradients i = 0, 1 again: what matters is that its step count,
    # moments and random bits continue, so compare against a run fed the same gradients
    resumed, _ = run(2, seed=1, resume_from=state, start=half)
    param = torch.nn.Parameter(start.clone())
    opt = AdamW([param], lr=1e-4, seed=1)
    for i in (0, 1, 0, 1):
        param.grad = torch.sin(torch.arange(1000.0) + i).bfloat16()
        opt.step()
    assert torch.equal(resumed, param.detach())


def bfloat16_steps(compile_update: bool, monkeypatch) -> tuple[AdamW, list[torch.Tensor]]:
    """Three steps of 2,500 bfloat16 weights in slices of 1,000; the optimizer, and the
    weights and moments after."""
    monkeypatch.setattr(oncurve.update.adamw, "SLICE", 1000)
    param = torch.nn.Parameter(torch.linspace(-1, 1, 2500).bfloat16())
    opt = AdamW([param], lr=1e-3, weight_decay=0.1, seed=4, compile_update=compile_update)
    for i in range(3):
        param.grad = torch.sin(torch.arange(2500.0) * (i + 1)).bfloat16()
        opt.step()
    state = opt.state[param]
    return opt, [param.detach().clone(), state["exp_avg"], state["exp_avg_sq"]]


def test_the_compiled_bfloat16_update_is_the_eager_one(monkeypatch):
    """`compile_update`: inductor's code for a slice's update (on the CPU here; on CUDA one
    kernel where the eager update launches about twenty) gives the eager update's weights and
    moments bit for bit, over several slices and steps, and stays compiled."""
    _, eager = bfloat16_steps(False, monkeypatch)
    opt, compiled = bfloat16_steps(True, monkeypatch)
    assert opt.compile_error is None
    assert opt._bfloat16_slice is not oncurve.update.adamw._bfloat16_slice
    assert eager[0].float().abs().sum() > 0 and not torch.equal(eager[1], torch.zeros(2500))
    for want, got in zip(eager, compiled, strict=True):
        assert torch.equal(got, want)


def test_a_compilation_that_fails_leaves_the_update_eager_with_one_warning(monkeypatch, capsys):
    """The first compiled call fails (as a missing compiler would): one warning line, the
    update runs eagerly from then on, and the weights are the eager run's, random bits
    included (the slice's draw is not made again)."""
    _, eager = bfloat16_steps(False, monkeypatch)
    calls = []

    def failing(*args):
        calls.append(args)
        raise RuntimeError("inductor: no working C++ compiler found")

    monkeypatch.setattr(torch, "compile", lambda fn, **options: failing)
    opt, fallen_back = bfloat16_steps(True, monkeypatch)
    assert (
        len(calls) == 1
        and opt.compile_error == "RuntimeError: inductor: no working C++ compiler found"
    )
    assert capsys.readouterr().err.count("compiling the optimizer's bfloat16 update failed") == 1
    for want, got in zip(eager, fallen_back, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["model.dtype=bfloat16"], AdamW),
        (["model.dtype=bfloat16", "optim.stochastic_rounding=false"], torch.optim.AdamW),
        (["model.dtype=float32"], torch.optim.AdamW),
    ],
)
def test_the_trainer_rounds_stochastically_where_weights_are_bfloat16(
    tiny_model_dir, data_file, tmp_path, extra, expected
):
    from oncurve.config import load_config
    from oncurve.loop.trainer import setup

    config = load_config(
        None,
        [f"model.path={tiny_model_dir}", f"data.path={data_file}", "run.device=cpu",
         f"run.dir={tmp_path / 'run'}", "reward.functions=[helpers.rewards_for_tests:count_digits]",
         "rollout.max_new_tokens=16", *extra],
    )  # fmt: skip
    s = setup(config)
    s.rewards.close()
    assert type(s.optimizer) is expected
