import dataclasses
import re
import typing

import pytest
import torch

from oncurve.advantages.sources import ADVANTAGE_SOURCES
from oncurve.algo import losses
from oncurve.algo.registry import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATIONS,
    IS_CORRECTIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    registered,
)
from oncurve.config import (
    PRESETS,
    RENAMED,
    AlgoConfig,
    Config,
    RewardFnConfig,
    build_config,
    check_preset_applied,
    describe,
    load_config,
    load_run_config,
    save_config,
    to_dict,
    with_model_path,
)
from oncurve.errors import UserError


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.epsilon=1.5"], "algo.epsilon must be in (0, 1], got 1.5"),
        (["algo.epsilon_high=0"], "algo.epsilon_high must be in (0, inf), got 0.0"),
        (
            ["data.curriculum_floor=0.3"],
            "data.curriculum_floor applies to data.curriculum=pass_rate, not none",
        ),
        (
            ["data.curriculum=pass_rate", "data.curriculum_threshold=0.5"],
            "data.curriculum_threshold applies to data.curriculum=difficulty, not pass_rate",
        ),
        (
            ["dist.nproc=2", "data.prompts_per_step=3"],
            "data.prompts_per_step (3) must be divisible by the number of ranks (dist.nproc: 2)",
        ),
        (["optim.lr=-1"], "optim.lr must be in (0, inf), got -1.0"),
        (
            ["data.chat_template_kwargs={tools: []}"],
            "data.chat_template_kwargs must not set tools (oncurve's own rendering sets it)",
        ),
        (
            ["data.chat_template_kwargs.add_generation_prompt=false"],
            "data.chat_template_kwargs must not set add_generation_prompt (oncurve's own",
        ),
        (["data.chat_template_kwargs=[1]"], "data.chat_template_kwargs must be a mapping of"),
        (["algo.beta=-0.1"], "algo.beta must be in [0, inf), got -0.1"),
        (["rollout.group_size=1"], "rollout.group_size must be in [2, inf), got 1"),
        (["rollout.group_size=abc"], "rollout.group_size must be int, got str 'abc'"),
        (["model.trust_remote_code=1"], "model.trust_remote_code must be bool, got int 1"),
        (["algo.loss_agg=mean"], "algo.loss_agg must be one of seq-mean-token-mean, token-mean"),
        (["algo.preset=ppo2"], "algo.preset must be one of grpo, dr_grpo, dapo, gspo, cispo, ppo"),
        (["algo.estimator=gea"], "algo.estimator must be one of grpo, rloo, gae, got 'gea'"),
        (["algo.loss=ppo"], "algo.loss must be one of ppo_clip, gspo, cispo, got 'ppo'"),
        (["algo.foo=1"], "unknown key algo.foo; algo has: preset,"),
        (["solver.lr=1"], "unknown key solver; config has: model,"),
        (["reward.functions=[{nme: x}]"], "unknown key reward.functions[0].nme"),
        (["algo=3"], "algo must be a mapping, got int"),
        (["algo.beta"], "override 'algo.beta' must look like section.key=value"),
        (["rollout.min_new_tokens=80"], "rollout.min_new_tokens must be at most"),
        (["dist.fsdp=true", "model.lora.r=4"], "dist.fsdp=true with model.lora.r > 0"),
        (["algo.kl_estimator=k1"], "algo.kl_estimator=k1 in the loss (algo.kl_in_reward=false)"),
        (
            ["algo.loss=gspo", "algo.loss_agg=token-mean"],
            "algo.loss_agg must be seq-mean-token-mean with algo.loss=gspo",
        ),
        (
            ["algo.preset=gspo", "algo.loss_agg=seq-mean-token-sum-norm"],
            "algo.loss_agg must be seq-mean-token-mean with algo.loss=gspo",
        ),
        (
            ["model.lora.r=8", "algo.ref_sync_every=10"],
            "algo.ref_sync_every > 0 with model.lora.r > 0 never syncs",
        ),
        (
            ["algo.preset=dr_grpo", "model.offload_reference=true"],
            "model.offload_reference=true offloads nothing: no frozen reference is held",
        ),
        (
            ["model.lora.r=4", "model.offload_reference=true"],
            "model.offload_reference=true offloads nothing: no frozen reference is held",
        ),
        (
            ["algo.preset=dr_grpo", "algo.ref_sync_every=1"],
            "algo.ref_sync_every > 0 syncs nothing with algo.beta=0 (no reference is held)",
        ),
        (
            ["reward.overlong_buffer=65"],
            "reward.overlong_buffer must be at most rollout.max_new_tokens (64), got 65",
        ),
        (
            ["algo.preset=dapo", "rollout.max_new_tokens=8", "reward.overlong_buffer=9"],
            "reward.overlong_buffer must be at most rollout.max_new_tokens (8), got 9",
        ),
        (
            ["algo.preset=ppo", "algo.estimator=rloo"],
            "algo.kl_in_reward needs algo.estimator=gae (a critic), got 'rloo' (algo.preset=ppo "
            "sets it)",
        ),
        (
            ["algo.preset=dapo", "rollout.env=python_tool", "rollout.max_turns=3"],
            "reward.overlong_buffer measures a completion against rollout.max_new_tokens, which",
        ),
        (
            ["reward.functions=[length]", "rollout.env=python_tool", "rollout.max_turns=2"],
            "the length reward measures a completion against rollout.max_new_tokens",
        ),
        (["eval.path=x.jsonl"], "eval.path has no effect here: a built-in task or a verifiers"),
        (["eval.num_prompts=0", "eval.every=5"], "eval.every has no effect here: eval.num_prom"),
        (["eval.num_prompts=0", "eval.samples=4"], "eval.samples has no effect here: eval.num"),
        (["log.wandb.name=x"], "log.wandb.name has no effect here: log.wandb.project is not set"),
        (["log.wandb.mode=offline"], "log.wandb.mode has no effect here: log.wandb.project is"),
        (["log.trackio.name=x"], "log.trackio.name has no effect here: log.trackio.project"),
        (
            ["data.path=x.jsonl", "eval.every=5"],
            "eval.every has no effect here: data.path has no held-out rows of its own; set "
            "eval.path",
        ),
        (["algo.preset=cispo", "algo.dual_clip=3"], "algo.dual_clip has no effect here"),
        (
            ["algo.preset=dr_grpo", "algo.adv_eps=0.001"],
            "algo.adv_eps has no effect here: algo.adv_scale=none divides by no std",
        ),
        (
            ["algo.estimator=rloo", "algo.adv_eps=0.001"],
            "algo.adv_eps has no effect here: algo.adv_scale=none divides by no std",
        ),
        (
            ["algo.estimator=gae", "algo.kl_in_reward=true", "algo.beta=0"],
            "algo.kl_in_reward has no effect here: algo.beta=0 puts no KL in the reward",
        ),
        (
            ["algo.preset=dr_grpo", "algo.kl_estimator=k2"],
            "algo.kl_estimator has no effect here: algo.beta=0 has no KL term to estimate; drop it",
        ),
        (["algo.norm_len=7"], "algo.norm_len has no effect here: only algo.loss_agg=seq-mean"),
        (["algo.max_resample=9"], "algo.max_resample has no effect here: algo.dynamic_sampling"),
        (["algo.gamma=0.5"], "algo.gamma has no effect here: only algo.estimator=gae uses it"),
        (["model.lora.alpha=99"], "model.lora.alpha has no effect here: model.lora.r=0"),
        (["model.lora={alpha: 99}"], "model.lora.alpha has no effect here: model.lora.r=0"),
        (["rollout.env_timeout_s=1"], "rollout.env_timeout_s has no effect here: rollout.env"),
        (["reward.overlong_penalty=9"], "reward.overlong_penalty has no effect here"),
        (["data.split=test"], "data.split has no effect here: it picks a split of data.path"),
        (["data.path=x.jsonl", "data.num_train=5"], "data.num_train has no effect here"),
        (["eval.split=validation"], "eval.split has no effect here: it picks a split of eval"),
        (["run.seed=99999999999999999999999"], "run.seed must be in [0, 9223372036854775807]"),
        (["run.dir="], "run.dir must not be empty (null for the default), got ''"),
        (["data.path="], "data.path must not be empty"),
        (["reward.timeout_score=.inf"], "reward.timeout_score must be a finite number, got inf"),
        (
            ["reward.functions=[{name: correct, weight: .inf}]"],
            "reward.functions[0].weight must be a finite number, got inf",
        ),
        (["algo.is_cap=0.5"], "algo.is_cap must be 0 (off) or at least 1 (a cap below 1"),
        (["algo.is_cap=-1"], "algo.is_cap must be 0 (off) or at least 1"),
        (["algo.is_cap=.nan"], "algo.is_cap must be 0 (off) or at least 1"),
        # no cap at all: a ratio past float range would weight its token's loss by inf
        (["algo.is_cap=.inf"], "algo.is_cap must be a finite number (0 is off), got inf"),
        (["algo.is_cap=1e400"], "algo.is_cap must be a finite number (0 is off), got inf"),
        (["optim.lr=nan"], "optim.lr must be in (0, inf), got nan"),
        (["optim.lr=inf"], "optim.lr must be in (0, inf), got inf"),
        (["algo.beta=.inf"], "algo.beta must be in [0, inf), got inf"),
        (["algo.epsilon=nan"], "algo.epsilon must be in (0, 1], got nan"),
        (["rollout.temperature=nan"], "rollout.temperature must be in (0, inf), got nan"),
        (["algo.is_correction=tis"], "algo.is_correction must be one of token_truncate, "),
        # empty text where a field needs some (`run.dir=` and `data.path=` above)
        (["rollout.stop="], "rollout.stop must not be empty ([] for none), got ''"),
        (['rollout.stop=[""]'], "rollout.stop[0] must not be empty ([] for none), got ''"),
        (["data.task="], "data.task must not be empty (null for none), got ''"),
        (["data.prompt_template="], "data.prompt_template must not be empty (null for the"),
        (["data.prompt_template=  "], "data.prompt_template must not be empty"),
        (["model.path="], "model.path must not be empty, got ''"),
        (["model.revision="], "model.revision must not be empty (null for the default)"),
        (["data.split= "], "data.split must not be empty, got ' '"),
        (["data.prompt_field="], "data.prompt_field must not be empty"),
        (["rollout.env="], "rollout.env must not be empty (null for the default)"),
        (["run.resume="], "run.resume must not be empty (null for the default)"),
        (["log.wandb.project="], "log.wandb.project must not be empty"),
        (["eval.path="], "eval.path must not be empty"),
        (["model.lora.target_modules=[q_proj, '']"], "model.lora.target_modules[1] must not be"),
        (["reward.functions="], "reward.functions must not be empty ([] for the environment's"),
        (["reward.functions=[{name: ''}]"], "reward.functions[0].name must not be empty"),
        # a list field's null is no list: reward.functions' would be the correct reward
        (
            ["reward.functions=null"],
            "reward.functions must be a list, got null; [] for the environment's or the task's "
            "own rewards, or the correct reward for data.path",
        ),
        (["reward.functions=[null]"], "reward.functions[0] must be a reward name or a mapping"),
        (["rollout.stop=~"], "rollout.stop must be a list, got null; [] for none"),
        # numbers past float's range or 64 bits
        (["run.steps=1" + "0" * 400], "run.steps must be between -(2**63 - 1) and 2**63 - 1, "),
        (["run.steps=1" + "0" * 5000], "run.steps must be between -(2**63 - 1) and 2**63 - 1"),
        (["run.seed=1" + "0" * 400], "run.seed must be in [0, 9223372036854775807], got a 401-"),
        (["optim.lr=1" + "0" * 400], "optim.lr must be a finite number, got a 401-digit number"),
        (["optim.lr=-1" + "0" * 5000], "optim.lr must be a finite number, got a 5001-digit"),
        (["algo.beta=1" + "0" * 400], "algo.beta must be a finite number, got a 401-digit number"),
    ],
)
def test_invalid_values_give_one_line_naming_the_field(overrides, message):
    with pytest.raises(UserError) as err:
        load_config(None, overrides)
    text = str(err.value)
    assert text.startswith(message)
    assert "\n" not in text


def test_a_split_or_config_of_a_local_file_is_refused(tmp_path):
    """A JSONL, CSV, JSON or Parquet file has no splits nor configs (a Hub dataset has both, a
    saved DatasetDict's directory splits): the setting would be said valid and do nothing."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    for overrides, message in [
        ([f"data.path={rows}", "data.split=validation"], f"data.split has no effect here: "
         f"data.path {rows} is a file, which has no splits"),
        ([f"data.path={rows}", "data.config=main"], f"data.config has no effect here: "
         f"data.path {rows} is a file, which has no configs"),
        ([f"data.path={rows}", f"eval.path={rows}", "eval.split=bogus"], f"eval.split has no "
         f"effect here: eval.path {rows} is a file, which has no splits"),
    ]:  # fmt: skip
        with pytest.raises(UserError, match=f"^{re.escape(message)}; drop it$"):
            load_config(None, overrides)
    saved = tmp_path / "saved"
    saved.mkdir()  # a saved dataset's directory may hold splits
    assert load_config(None, [f"data.path={saved}", "data.split=test"]).data.split == "test"


def test_a_split_of_one_saved_dataset_is_refused(tmp_path):
    """`Dataset.save_to_disk` writes one dataset, without splits (a DatasetDict's directory
    holds one per split): a split set for it would be said valid and do nothing."""
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    rows = [{"prompt": "1+1=", "answer": "2"}]
    one, split = tmp_path / "one", tmp_path / "split"
    datasets.Dataset.from_list(rows).save_to_disk(str(one))
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(split))
    for overrides, message in [
        ([f"data.path={one}", "data.split=validation"], f"data.split has no effect here: "
         f"data.path {one} is the directory of one saved Dataset, which has no splits"),
        ([f"data.path={one}", f"eval.path={one}", "eval.split=train"], f"eval.split has no "
         f"effect here: eval.path {one} is the directory of one saved Dataset, which has no "
         "splits"),
    ]:  # fmt: skip
        with pytest.raises(UserError, match=f"^{re.escape(message)}; drop it$"):
            load_config(None, overrides)
    config = load_config(None, [f"data.path={one}", f"eval.path={split}", "eval.split=test"])
    assert (config.data.split, config.eval.split) == ("train", "test")


def test_a_config_of_a_local_directory_is_refused(tmp_path):
    """A directory `save_to_disk` wrote, of one Dataset or a DatasetDict, has no configs, which
    only a Hub dataset has: data.config, which picks one for data.path and eval.path alike,
    would be said valid and do nothing unless one of them is a Hub dataset."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    saved = tmp_path / "saved"
    saved.mkdir()
    for overrides, message in [
        ([f"data.path={saved}", "data.config=main"], f"data.config has no effect here: "
         f"data.path {saved} is a directory, which has no configs"),
        ([f"data.path={saved}", f"eval.path={rows}", "data.config=main"], f"data.config has no "
         f"effect here: data.path {saved} is a directory and eval.path {rows} is a file, neither "
         "of which has configs"),
    ]:  # fmt: skip
        with pytest.raises(UserError, match=f"^{re.escape(message)}; drop it$"):
            load_config(None, overrides)
    # a Hub dataset's config, beside local data
    for overrides in (
        [f"data.path={saved}", "eval.path=acme/held-out", "data.config=main"],
        [f"data.path={rows}", "eval.path=acme/held-out", "data.config=main"],
        ["data.path=acme/train", f"eval.path={saved}", "data.config=main"],
    ):
        assert load_config(None, overrides).data.config == "main"


def test_overrides_are_typed_from_yaml_syntax():
    config = load_config(None, ["algo.beta=0.0", "rollout.stop=[</answer>]", "optim.lr=1e-5"])
    assert config.algo.beta == 0.0
    assert config.rollout.stop == ["</answer>"]
    assert config.optim.lr == pytest.approx(1e-5)


@pytest.mark.parametrize(
    "text", ["2024_01_05", "007", "10:30", "1.50", "0123456", "yes", "2024-01-05", "1e3"]
)
def test_a_text_setting_keeps_the_override_as_written(text):
    """YAML would read these as numbers, booleans or dates: a text field takes the text."""
    config = load_config(None, [f"run.dir={text}", f"model.revision={text}"])
    assert (config.run.dir, config.model.revision) == (text, text)
    assert load_config(None, ["run.dir=null"]).run.dir is None
    assert load_config(None, ["run.dir='x y'"]).run.dir == "x y"


@pytest.mark.parametrize(
    "text",
    ["runs/exp #2", "# Rules", "Answer: a number.", "Question: {question}", "[draft", "a, b"],
)
def test_a_text_setting_keeps_comment_marks_colons_and_brackets(text):
    """YAML would cut a ` #` comment, read `: ` as a mapping or fail on `[`: a text field takes
    the text as written."""
    config = load_config(None, [f"run.dir={text}", f"data.system_prompt={text}"])
    assert (config.run.dir, config.data.system_prompt) == (text, text)


def test_list_settings_are_read_whole_and_refuse_what_yaml_cannot_read(tmp_path):
    assert load_config(None, ["rollout.stop=42"]).rollout.stop == ["42"]
    with pytest.raises(UserError, match=r"rollout.stop: '\[a' is not valid YAML"):
        load_config(None, ["rollout.stop=[a"])
    with pytest.raises(UserError, match=r"reward.functions is a list; set it whole"):
        load_config(None, ["reward.functions.weight=0.5"])
    path = tmp_path / "c.yaml"
    path.write_text("reward:\n  functions: [correct]\nmodel:\n  # path: x\n")
    with pytest.raises(UserError, match=r"reward.functions.weight: reward.functions is a list"):
        load_config(path, ["reward.functions.weight=0.5"])
    # one reward spec as a mapping is a list of one; a dotted key into a mapping setting is YAML
    only = load_config(None, ["reward.functions={name: format, weight: 0.5}"]).reward.functions
    assert [(r.name, r.weight) for r in only] == [("format", 0.5)]
    options = ["data.task=countdown", "data.task_options.counts=[3]", "data.task_options.x=null"]
    assert load_config(None, options).data.task_options == {"counts": [3], "x": None}
    # a section left empty in the file takes overrides
    assert load_config(path, ["model.path=default"]).model.path == "default"


def test_rewards_accept_names_and_weighted_mappings():
    config = load_config(None, ["reward.functions=[correct, {name: 'pkg.mod:fn', weight: 0.5}]"])
    assert [(r.name, r.weight) for r in config.reward.functions] == [
        ("correct", 1.0),
        ("pkg.mod:fn", 0.5),
    ]


def test_preset_sets_fields_and_explicit_values_win(tmp_path):
    config = load_config(None, ["algo.preset=dapo"])
    for section, values in PRESETS["dapo"].items():
        for key, value in values.items():
            assert getattr(getattr(config, section), key) == value
    path = tmp_path / "c.yaml"
    path.write_text("algo:\n  preset: dapo\n  epsilon_high: 0.3\n")
    config = load_config(path, ["algo.beta=0.01"])
    assert config.algo.epsilon_high == 0.3
    assert config.algo.beta == 0.01
    assert config.algo.loss_agg == "token-mean"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rewards=[correct]", "rewards was renamed reward.functions"),
        ("run.reward_timeout=5", "run.reward_timeout was renamed reward.timeout"),
        ("run.reward_timeout_score=0", "run.reward_timeout_score was renamed reward.timeout_score"),
        ("run.reward_errors=none", "run.reward_errors was renamed reward.errors"),
        ("algo.overlong_buffer=4", "algo.overlong_buffer moved to reward.overlong_buffer"),
        ("algo.tis_cap=2", "algo.tis_cap was renamed algo.is_cap"),
        ("algo.overlong_penalty=0.5", "algo.overlong_penalty moved to reward.overlong_penalty"),
    ],
)
def test_an_old_key_names_its_new_place(tmp_path, override, message):
    with pytest.raises(UserError) as err:
        load_config(None, [override])
    assert str(err.value) == message
    # the same from a YAML file, and also with the algo preset that sets the new key
    key, _, value = override.partition("=")
    *sections, leaf = key.split(".")
    text = "".join(f"{'  ' * i}{s}:\n" for i, s in enumerate(sections))
    path = tmp_path / "old.yaml"
    path.write_text(f"{text}{'  ' * len(sections)}{leaf}: {value}\n")
    with pytest.raises(UserError) as err:
        load_config(path, ["algo.preset=dapo"])
    assert str(err.value) == message


def test_every_rename_names_a_setting_that_exists():
    names = {name for name, _ in leaf_fields(Config)}
    for old, new in RENAMED.items():
        assert new in names, new
        assert old not in names, old


def test_dapo_preset_sets_the_overlong_buffer_and_the_user_can_override_it(tmp_path):
    """DAPO's soft overlong window is the last 4096 of its 20480 new tokens: the preset's is a
    fifth of the final rollout.max_new_tokens (rounded up), whichever layer sets that."""
    assert load_config(None, ["algo.preset=dapo"]).reward.overlong_buffer == 13  # 64 tokens
    long = ["algo.preset=dapo", "rollout.max_new_tokens=20480"]
    assert load_config(None, long).reward.overlong_buffer == 4096
    assert load_config(None, ["algo.preset=dapo", "model.path=x"]).reward.overlong_buffer == 52
    assert (
        load_config(None, ["algo.preset=dapo", "rollout.max_new_tokens=1"]).reward.overlong_buffer
        == 1
    )
    assert load_config(None).reward.overlong_buffer == 0
    config = load_config(None, ["algo.preset=dapo", "reward.overlong_buffer=0"])
    assert config.reward.overlong_buffer == 0
    assert config.algo.epsilon_high == 0.28  # the rest of the preset still applies
    path = tmp_path / "c.yaml"
    path.write_text("algo:\n  preset: dapo\nreward:\n  overlong_buffer: 8\n  timeout: 2\n")
    config = load_config(path, ["rollout.max_new_tokens=100"])
    assert (config.reward.overlong_buffer, config.reward.timeout) == (8, 2.0)
    path.write_text("algo:\n  preset: dapo\nrollout:\n  max_new_tokens: 100\n")
    assert load_config(path).reward.overlong_buffer == 20
    assert load_config(path, ["rollout.max_new_tokens=30"]).reward.overlong_buffer == 6
    # the preset's reward key sits below other reward keys the user sets
    config = load_config(None, ["algo.preset=dapo", "reward.functions=correct"])
    assert config.reward.overlong_buffer == 13
    assert [f.name for f in config.reward.functions] == ["correct"]
    # a run's config.yaml keeps the window it trained with
    save_config(load_config(None, long), tmp_path / "config.yaml")
    assert load_run_config(tmp_path / "config.yaml").reward.overlong_buffer == 4096


@pytest.mark.parametrize("preset", ["gspo", "dapo", "cispo"])
def test_the_clipped_presets_update_off_policy_in_four_minibatches(preset):
    """GSPO's sequence-ratio clip, DAPO's clip-higher and CISPO's cap bind only once the
    policy has moved since sampling: the presets split each step's groups in 4 minibatches,
    which the default 16 prompts fill on up to 4 ranks. Where they do not fit, the error says
    that the preset set it and what to change."""
    algo = load_config(None, [f"algo.preset={preset}"]).algo
    assert (algo.mu, algo.minibatches) == (1, 4)
    assert load_config(None, [f"algo.preset={preset}", "dist.nproc=4"]).algo.minibatches == 4
    for overrides, per_rank, fix in (
        (
            ["data.prompts_per_step=2"],
            "(2 / 1 = 2)",
            "algo.minibatches=2, or data.prompts_per_step=4",
        ),
        (["dist.nproc=8"], "(16 / 8 = 2)", "algo.minibatches=2, or data.prompts_per_step=32"),
    ):
        with pytest.raises(UserError) as err:
            load_config(None, [f"algo.preset={preset}", *overrides])
        assert str(err.value) == (
            f"algo.minibatches must be at most data.prompts_per_step per rank {per_rank}, got 4 "
            f"(algo.preset={preset} sets it): set {fix} or more"
        )
    fitted = ["data.prompts_per_step=2", "algo.minibatches=2"]
    assert load_config(None, [f"algo.preset={preset}", *fitted]).algo.minibatches == 2
    # a value the user gave is the user's to change: no preset is named
    with pytest.raises(UserError) as err:
        load_config(None, ["data.prompts_per_step=2", "algo.minibatches=3"])
    assert str(err.value) == (
        "algo.minibatches must be at most data.prompts_per_step per rank (2 / 1 = 2), got 3"
    )


def test_sections_follow_the_data_flow():
    assert [f.name for f in dataclasses.fields(Config)] == [
        "model",
        "data",
        "rollout",
        "reward",
        "algo",
        "optim",
        "eval",
        "log",
        "run",
        "dist",
    ]


def test_describe_lists_the_reward_keys():
    listing = describe().splitlines()
    for key in (
        "reward.functions",
        "reward.functions[].name",
        "reward.functions[].weight",
        "reward.timeout",
        "reward.timeout_score",
        "reward.errors",
        "reward.overlong_buffer",
        "reward.overlong_penalty",
    ):
        assert any(line.startswith(f"{key} = ") for line in listing), key
    assert not any(line.startswith(("rewards", "run.reward", "algo.overlong")) for line in listing)


def test_the_algorithm_checks_accept_the_valid_neighbours():
    # k1 in the reward rather than the loss; gspo with its own aggregation; a buffer the whole
    # completion long (the penalty then ramps from the first token); a synced reference without
    # LoRA
    in_reward = ["algo.kl_estimator=k1", "algo.estimator=gae", "algo.kl_in_reward=true"]
    assert load_config(None, in_reward).algo.kl_estimator == "k1"
    assert load_config(None, ["algo.loss=gspo"]).algo.loss == "gspo"
    assert load_config(None, ["reward.overlong_buffer=64"]).reward.overlong_buffer == 64
    assert load_config(None, ["algo.ref_sync_every=10"]).algo.ref_sync_every == 10
    assert load_config(None, ["model.lora.r=8"]).model.lora.r == 8
    # the correction off, a cap of exactly 1, and null (settled at the start of a run)
    assert load_config(None, ["algo.is_cap=0"]).algo.is_cap == 0.0
    assert load_config(None, ["algo.is_cap=1"]).algo.is_cap == 1.0
    assert load_config().algo.is_cap is None
    assert load_config().algo.is_correction == "token_truncate"
    assert load_config(None, ["algo.is_correction=none"]).algo.is_correction == "none"


def test_help_says_which_kl_each_estimator_follows_in_the_loss():
    (line,) = [x for x in describe().splitlines() if x.startswith("algo.kl_estimator = ")]
    assert "k3's gradient is that of KL(pi_ref || pi)" in line
    assert "k2's that of KL(pi || pi_ref)" in line
    assert "k1 only with algo.kl_in_reward=true" in line


@pytest.mark.parametrize("preset", ["grpo", "dapo", "gspo"])
def test_rloo_divides_by_no_std_unless_told(tmp_path, preset):
    config = load_config(None, [f"algo.preset={preset}", "algo.estimator=rloo"])
    assert config.algo.adv_scale == "none"
    # G = 4, rewards 1, 0, 0, 0: A_1 = 1 - 0 and A_j = 0 - 1/3 (the mean of the other three)
    rloo = ADVANTAGE_ESTIMATORS[config.algo.estimator]
    advantages = rloo(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, scale=config.algo.adv_scale)
    torch.testing.assert_close(advantages, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    # an explicit adv_scale wins, from the command line or from the file
    config = load_config(
        None, [f"algo.preset={preset}", "algo.estimator=rloo", "algo.adv_scale=group"]
    )
    assert config.algo.adv_scale == "group"
    path = tmp_path / "c.yaml"
    path.write_text(f"algo:\n  preset: {preset}\n  adv_scale: batch\n")
    assert load_config(path, ["algo.estimator=rloo"]).algo.adv_scale == "batch"
    assert load_config(None, [f"algo.preset={preset}"]).algo.adv_scale == "group"


def test_the_cispo_preset_is_minimax_m1s_objective():
    """Token-level REINFORCE with the importance weight capped above only (epsilon 1: a ratio
    is never below 0), at 5 as TRL recommends, and no KL."""
    algo = load_config(None, ["algo.preset=cispo"]).algo
    assert (algo.loss, algo.loss_agg, algo.beta, algo.epsilon, algo.epsilon_high) == (
        "cispo",
        "token-mean",
        0.0,
        1.0,
        4.0,
    )


def test_default_preset_is_deepseekmath():
    config = load_config()
    assert (config.algo.beta, config.algo.epsilon, config.epsilon_high) == (0.04, 0.2, 0.2)
    assert (config.algo.adv_scale, config.algo.loss_agg, config.algo.kl_estimator) == (
        "group",
        "seq-mean-token-mean",
        "k3",
    )


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_yaml_round_trip_gives_the_same_config(tmp_path, preset):
    config = load_config(None, [f"algo.preset={preset}", "reward.functions=[correct]", "run.dir=x"])
    path = tmp_path / "config.yaml"
    save_config(config, path)
    assert load_config(path) == config
    assert build_config(to_dict(config)) == config


def test_bad_yaml_file_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("algo: [\n")
    with pytest.raises(UserError, match="bad.yaml.*not valid YAML"):
        load_config(path)
    path.write_text("run:\n  steps: 1\nrun:\n  steps: 2\n")  # safe_load would keep the last
    with pytest.raises(UserError, match=r"bad.yaml line 3: 'run' is given twice"):
        load_config(path)
    path.write_text("optim:\n  lr: 0.1\n  lr: 0.2\n")
    with pytest.raises(UserError, match=r"bad.yaml line 3: 'lr' is given twice"):
        load_config(path)
    with pytest.raises(UserError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def leaf_fields(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field]]:
    """(dotted name, field) of every setting; sections are walked, not listed."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += leaf_fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", f))
    return out


def test_every_setting_has_help_text_and_a_default():
    fields = leaf_fields(Config) + leaf_fields(RewardFnConfig, "reward.functions[].")
    assert len(fields) > 80
    listing = describe().splitlines()
    for name, f in fields:
        assert f.metadata.get("help", "").strip(), f"{name} has no help text"
        has_default = f.default is not dataclasses.MISSING
        assert has_default or f.default_factory is not dataclasses.MISSING, name
        assert any(line.startswith(f"{name} = ") for line in listing), name


def test_algorithm_choices_are_the_registry_names():
    """A variant registered at its definition is a choice of its config field, in the order
    the definitions come; a name registered twice is refused."""
    choices = {f.name: f.metadata["choices"] for f in dataclasses.fields(AlgoConfig)}
    assert choices["estimator"] == ("grpo", "rloo", "gae") == tuple(ADVANTAGE_SOURCES)
    assert choices["loss"] == ("ppo_clip", "gspo", "cispo") == tuple(POLICY_LOSSES)
    assert POLICY_LOSSES["cispo"] is losses.cispo
    assert choices["loss_agg"] == tuple(AGGREGATIONS) and len(AGGREGATIONS) == 3
    assert choices["kl_estimator"] == ("k1", "k2", "k3") == tuple(KL_ESTIMATORS)
    assert choices["is_correction"] == (*IS_CORRECTIONS, "none")
    assert tuple(IS_CORRECTIONS) == (
        "token_truncate",
        "token_mask",
        "sequence_truncate",
        "sequence_mask",
    )
    assert choices["preset"] == tuple(PRESETS)
    with pytest.raises(ValueError, match="'k3' is registered twice"):
        registered(dict(KL_ESTIMATORS), "k3")(losses.cispo)


# the sections' annotations are strings (`from __future__ import annotations`)
FLOAT_SETTINGS = [name for name, f in leaf_fields(Config) if f.type in ("float", "float | None")]


@pytest.mark.parametrize("name", FLOAT_SETTINGS)
def test_every_number_setting_refuses_nan_in_one_line_naming_it(name):
    with pytest.raises(UserError) as err:
        load_config(None, [f"{name}=nan"])
    assert str(err.value).startswith(f"{name} must be") and "\n" not in str(err.value)


def test_empty_text_is_taken_where_it_means_something(tmp_path):
    """A system prompt may be empty (none, as null); a stop string may be whitespace alone."""
    config = load_config(None, ["data.system_prompt=", 'rollout.stop=[" ", "\\n"]'])
    assert (config.data.system_prompt, config.rollout.stop) == ("", [" ", "\n"])
    path = tmp_path / "c.yaml"
    path.write_text('rollout:\n  stop: ["</answer>", ""]\n')
    with pytest.raises(UserError, match=r"^rollout.stop\[1\] must not be empty \(\[\] for none"):
        load_config(path)


def test_text_holding_a_surrogate_is_refused_naming_the_setting(tmp_path):
    """YAML's `\\ud800` escape, and a command line's undecodable byte, give a surrogate:
    no Unicode character, which a tokenizer and a UTF-8 writer refuse later."""
    unpaired = "holds a surrogate \\ud800, which is no Unicode character"
    path = tmp_path / "c.yaml"
    path.write_text('data:\n  system_prompt: "Answer \\ud800"\n')
    with pytest.raises(UserError) as err:
        load_config(path)
    assert str(err.value) == f"data.system_prompt {unpaired}"
    refused = {
        'data.system_prompt="\\ud800"': f"data.system_prompt {unpaired}",
        "data.system_prompt=\ud800": f"data.system_prompt {unpaired}",
        "run.dir=runs/\udcff": "run.dir holds a surrogate \\udcff",
        'rollout.stop=["</answer>", "\\ud800"]': f"rollout.stop[1] {unpaired}",
        'data.task_options={names: ["\\ud800"]}': f"data.task_options {unpaired}",
        'reward.functions=["\\ud800"]': f"reward.functions[0] {unpaired}",
    }
    for override, message in refused.items():
        with pytest.raises(UserError) as err:
            load_config(None, ["data.task=countdown", override])
        assert str(err.value).startswith(message) and "\n" not in str(err.value), override
    # YAML's escapes are characters: UTF-16's pair for one is two surrogates, its \U escape
    # the character
    path.write_text('data:\n  system_prompt: "\\ud83d\\ude00"\n')
    with pytest.raises(UserError, match=r"^data.system_prompt holds a surrogate \\ud83d,"):
        load_config(path)
    path.write_text('data:\n  system_prompt: "\\U0001F600"\n')
    assert load_config(path).data.system_prompt == "\U0001f600"


def test_a_list_left_empty_in_yaml_is_refused_not_defaulted(tmp_path):
    """`functions:` with nothing after it is null in YAML, which would have been [correct]."""
    path = tmp_path / "c.yaml"
    path.write_text("reward:\n  functions:\n")
    with pytest.raises(UserError, match=r"^reward.functions must be a list, got null; \[\] for"):
        load_config(path)
    path.write_text("reward:\n  functions: []\n")
    assert load_config(path).reward.functions == []


def test_a_section_given_as_a_mapping_keeps_the_files_other_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "model:\n  lora: {r: 4, alpha: 8}\n"
        "data:\n  task: countdown\n  task_options: {counts: [4], max_number: 50}\n"
        "run:\n  steps: 30\n  dir: mine\n  seed: 7\n"
    )
    config = load_config(path, ["run={steps: 5}"])
    assert (config.run.steps, config.run.dir, config.run.seed) == (5, "mine", 7)
    # in order with dotted overrides, and a subsection merged key by key too
    config = load_config(path, ["run.seed=9", "run={steps: 5, dir: 007}", "model={lora: {r: 8}}"])
    assert (config.run.steps, config.run.dir, config.run.seed) == (5, "007", 9)
    assert (config.model.lora.r, config.model.lora.alpha) == (8, 8.0)
    # a mapping setting is one value: given whole, it replaces the file's
    config = load_config(path, ["data={task_options: {counts: [3]}}"])
    assert (config.data.task, config.data.task_options) == ("countdown", {"counts": [3]})


def test_an_override_into_an_aliased_mapping_changes_that_place_only(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "log:\n  wandb: &tracker\n    name: exp1\n    project: p\n  trackio: *tracker\n"
    )
    config = load_config(path, ["log.wandb.name=exp2"])
    assert (config.log.wandb.name, config.log.trackio.name) == ("exp2", "exp1")


def test_yaml_merge_keys_work_and_real_duplicates_are_still_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "log:\n  wandb: &tracker\n    name: exp1\n    project: p\n"
        "  trackio:\n    <<: *tracker\n    name: exp2\n"
    )
    trackio = load_config(path).log.trackio
    assert (trackio.project, trackio.name) == ("p", "exp2")  # its own key wins, as in safe_load
    path.write_text(
        "log:\n  wandb: &tracker\n    name: exp1\n  trackio:\n    <<: *tracker\n"
        "    project: p\n    project: q\n"
    )
    with pytest.raises(UserError, match=r"c.yaml line 7: 'project' is given twice"):
        load_config(path)


def test_a_number_in_yaml_for_a_text_setting_keeps_its_text(tmp_path):
    """YAML 1.1 reads `007` as 7, `0123456` as an octal and `12:30` as 750: a text setting takes
    what was written, as it does from the command line; number settings stay numbers."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "model:\n  revision: 0123456\ndata:\n  system_prompt: 1.50\n"
        "rollout:\n  stop: [42, 0x1F]\n  temperature: 0.5\n"
        "log:\n  wandb:\n    name: 12:30\n    project: 1_000\n"
        "run:\n  dir: 007\n  steps: 3\n  seed: 7\n"
    )
    config = load_config(path)
    assert (config.model.revision, config.data.system_prompt) == ("0123456", "1.50")
    assert (config.log.wandb.name, config.log.wandb.project) == ("12:30", "1_000")
    assert (config.run.dir, config.rollout.stop) == ("007", ["42", "0x1F"])
    assert load_config(None, ["rollout.stop=[42, 007]"]).rollout.stop == ["42", "007"]
    # the numbers are plain ones, which a run's config.yaml is written with
    assert type(config.run.steps) is int and type(config.rollout.temperature) is float
    options = load_config(path, ["data.task=countdown", "data.task_options={counts: [3]}"])
    assert [type(n) for n in options.data.task_options["counts"]] == [int]
    save_config(options, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == options
    # keys too: a mapping of an environment's arguments keyed by numbers
    keyed = load_config(None, ["rollout.env=python_tool", "rollout.env_args={scores: {0: 1.5}}"])
    ((key, value),) = keyed.rollout.env_args["scores"].items()
    assert (type(key), type(value)) == (int, float)
    save_config(keyed, tmp_path / "keyed.yaml")
    assert load_config(tmp_path / "keyed.yaml") == keyed
    path.write_text("run:\n  steps: 1" + "0" * 400 + "\n")
    with pytest.raises(UserError, match=r"^run.steps must be between .*, got a 401-digit number$"):
        load_config(path)


def test_a_run_config_that_lacks_a_section_is_refused_naming_the_file(tmp_path):
    """A cut-short config.yaml would have run `oncurve eval --run` with the defaults."""
    config = load_config(None, ["run.seed=3", "eval.num_prompts=2"])
    path = tmp_path / "config.yaml"
    save_config(config, path)
    assert load_run_config(path) == config
    text = path.read_text()
    path.write_text(text[: text.index("\nalgo:")])
    with pytest.raises(UserError) as err:
        load_run_config(path)
    assert str(err.value) == (
        f"config file {path} lacks algo, optim, eval, log, run, dist; a run's config.yaml holds "
        "every section (this one was cut short or edited)"
    )
    path.write_text("")
    with pytest.raises(UserError, match=r"^config file .*config.yaml is empty; a run's config"):
        load_run_config(path)


@pytest.mark.parametrize("preset", ["dr_grpo", "dapo", "gspo", "cispo", "ppo"])
def test_a_python_config_naming_a_preset_it_does_not_hold_is_refused_by_train(preset, tmp_path):
    """Loading applies a preset below the settings given; a Config made in Python applies none,
    so `train` refuses one that names a preset and holds none of its settings, rather than train
    without it; a loaded one that overrides every setting its preset brings is the user's."""
    from oncurve.loop.trainer import train

    config = load_config(None, [f"algo.preset={preset}", f"run.dir={tmp_path / 'run'}"])
    base = Config()
    made = dataclasses.replace(
        base,
        algo=dataclasses.replace(base.algo, preset=preset),
        data=dataclasses.replace(base.data, task="arith"),
        run=dataclasses.replace(base.run, dir=str(tmp_path / "run")),
    )
    with pytest.raises(UserError, match=rf"^algo.preset={preset} sets .*a Config made in Python"):
        train(made)
    assert not (tmp_path / "run").exists()
    # an ablation loaded with every setting of its preset overridden is the user's
    brought = {"dr_grpo": ["algo.adv_scale=group", "algo.loss_agg=token-mean", "algo.beta=0.04"]}
    check_preset_applied(load_config(None, [f"algo.preset={preset}", *brought.get(preset, [])]))
    with pytest.raises(UserError, match=r"^algo.preset must be one of grpo, .*got 'drgrpo'$"):
        check_preset_applied(
            dataclasses.replace(base, algo=dataclasses.replace(base.algo, preset="drgrpo"))
        )
    # one changed after loading keeps the preset's other settings: accepted
    check_preset_applied(dataclasses.replace(config, algo=dataclasses.replace(config.algo, mu=2)))


@pytest.mark.parametrize(
    ("section", "key", "value", "error"),
    [
        ("optim", "lr", "fast", "optim.lr must be float, got str 'fast'"),
        ("run", "steps", "1", "run.steps must be int, got str '1'"),
        ("rollout", "group_size", 1, "rollout.group_size must be in [2, inf), got 1"),
        ("algo", "epsilon", 5.0, "algo.epsilon must be in (0, 1], got 5.0"),
        (
            "algo",
            "loss_agg",
            "token_mean",
            "algo.loss_agg must be one of seq-mean-token-mean, token-mean, "
            "seq-mean-token-sum-norm, got 'token_mean'",
        ),
    ],
)
def test_train_checks_every_field_of_a_config_changed_in_python(
    section, key, value, error, tmp_path
):
    """A field set in Python skipped loading's checks of it: `train` checks every field as
    loading does, refusing a bad one in the line loading gives, before the run starts."""
    from oncurve.loop.trainer import train

    config = load_config(None, ["run.preflight=false", f"run.dir={tmp_path / 'run'}"])
    setattr(getattr(config, section), key, value)
    with pytest.raises(UserError) as err:
        train(config, quiet=True)
    assert str(err.value) == error
    assert not (tmp_path / "run").exists()


def test_overrides_apply_in_order_so_a_later_one_wins():
    """Overrides are ordered, as Hydra's are: a setting given again (a script's base arguments
    with one changed after them) takes the later value, key by key into a section."""
    assert load_config(None, ["run.steps=3", "run.steps=5"]).run.steps == 5
    config = load_config(None, ["run={steps: 3, seed: 4}", "run.steps=5"])
    assert (config.run.steps, config.run.seed) == (5, 4)
    assert load_config(None, ["run.steps=5", "run={steps: 3}"]).run.steps == 3
    assert load_config(None, ["run.steps=5", "run=null"]).run.steps == 150  # the section's reset


@pytest.mark.parametrize(
    ("setting", "written"),
    [("run.steps", "010"), ("run.seed", "0042"), ("run.steps", "1:30"), ("optim.lr", "010")],
)
def test_a_number_yaml_1_1_reads_as_octal_or_base_60_is_refused(tmp_path, setting, written):
    """YAML 1.1 reads `010` as 8 and `1:30` as 90, YAML 1.2 and a reader's eye as 10 and an
    error: a number setting refuses the ambiguity in one line, from a file and an override."""
    section, key = setting.split(".")
    path = tmp_path / "c.yaml"
    path.write_text(f"{section}:\n  {key}: {written}\n")
    for args in ((path, None), (None, [f"{setting}={written}"])):
        with pytest.raises(UserError) as err:
            load_config(*args)
        assert str(err.value).startswith(f"{setting}: {written!r} is ambiguous")
    # the forms that mean one number each stay numbers
    assert load_config(None, ["run.steps=10", "run.seed=0x10", "optim.lr=0.010"]).run.seed == 16
    assert load_config(None, ["run.save_every=0", "optim.lr=1_000"]).optim.lr == 1000.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("run:\n\tsteps: 5\n", "line 2 is not valid YAML (a tab: YAML indents with spaces)"),
        ("run: {steps: 5\n", "line 2 is not valid YAML (expected ',' or '}', but got '<stream"),
        ("optim: {lr: *rate}\n", "line 1 is not valid YAML (found undefined alias 'rate')"),
    ],
)
def test_a_yaml_file_that_does_not_parse_is_named_with_its_line_and_why(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_config(path)
    assert str(err.value).startswith(f"config file {path} {message}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("run.stepz=5", "unknown key run.stepz (did you mean run.steps?); run has: steps, seed,"),
        ("algo.betta=0.1", "unknown key algo.betta (did you mean algo.beta?); algo has: preset,"),
        ("rolout.group_size=8", "unknown key rolout (did you mean rollout?); config has: model,"),
        # a setting given in the wrong section is named where it is
        ("run.lr=1e-5", "unknown key run.lr (optim.lr has that name); run has: steps,"),
        ("lr=1e-5", "unknown key lr (optim.lr has that name); config has: model,"),
        ("rollout.seed=3", "unknown key rollout.seed (run.seed has that name); rollout has:"),
        ("reward.functions=[{nme: x}]", "unknown key reward.functions[0].nme (did you mean "),
        ("run.foo=1", "unknown key run.foo; run has: steps,"),
    ],
)
def test_an_unknown_key_names_the_key_meant(override, message):
    with pytest.raises(UserError) as err:
        load_config(None, [override])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_config_from_a_pipe_is_read_as_a_file_is(tmp_path):
    """`oncurve train <(sed ... base.yaml)`: bash's process substitution names a pipe, which
    is no regular file but is read as one."""
    import os
    import threading

    fifo = tmp_path / "63"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("run:\n  steps: 7\n"))
    writer.start()
    try:
        config = load_config(fifo)
    except BaseException:
        # a writer still waiting for a reader gets one that never blocks, and finishes
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        writer.join()
        os.close(reader)
        raise
    writer.join()
    assert config.run.steps == 7
    assert load_config(os.devnull).run.steps == load_config(None).run.steps  # empty


def test_a_model_path_set_on_a_config_made_in_python_or_loaded_for_the_bundled_model():
    """A config made in Python (a real model's defaults) gets the path alone; one that holds a
    bundled model's default, as loading without a model path gives, is refused in one line."""
    made = Config()
    given = with_model_path(made, "org/model")
    assert given == dataclasses.replace(
        made, model=dataclasses.replace(made.model, path="org/model")
    )
    loaded = load_config(None, ["optim.lr=2e-5", "rollout.max_new_tokens=32"])
    with pytest.raises(UserError) as err:
        with_model_path(loaded, "org/model")
    assert str(err.value) == (
        "model: the config, loaded for the bundled model (model.path default), holds its "
        "eval.num_prompts=500; load it with the model's path: "
        "oncurve.load_config(path, ['model.path=org/model', ...]), or pass train the YAML "
        "file's path"
    )
    # loaded for the bundled model, holding none of its defaults: its settings are the user's
    overridden = load_config(
        None, ["optim.lr=2e-5", "rollout.max_new_tokens=32", "eval.num_prompts=9"]
    )
    assert with_model_path(overridden, "org/model") == dataclasses.replace(
        overridden, model=dataclasses.replace(overridden.model, path="org/model")
    )
