"""LoRA through peft: only adapters train, the reference is the adapter switched off, and the
merged final model behaves as the adapted one."""

from __future__ import annotations

import json
import shutil
import warnings

import huggingface_hub
import pytest
import torch
import transformers
from helpers.configs import make_config
from safetensors.torch import load_file

from oncurve.errors import UserError
from oncurve.loop.trainer import setup, train
from oncurve.loop.training_step import training_step
from oncurve.model.forward import PolicyLogprobs
from oncurve.rollout import SamplingParams
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings, batch_logprobs

pytest.importorskip("peft", reason="the lora extra (peft) is not installed")

LORA = ("model.lora.r=4", "model.lora.alpha=8", "optim.lr=5e-2", "algo.beta=0.04")


@pytest.mark.parametrize("pack", [False, True], ids=["padded", "packed rows"])
def test_only_adapter_weights_change(tiny_model_dir, data_file, tmp_path, pack):
    packing = (f"model.pack_rows={str(pack).lower()}",)
    s = setup(make_config(tiny_model_dir, data_file, tmp_path / "run", *LORA, *packing))
    assert s.config.model.pack_rows is pack
    before = {n: p.detach().clone() for n, p in s.policy.model.named_parameters()}
    for step in (1, 2):
        training_step(s, step)
    changed = {n for n, p in s.policy.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    trainable = {n for n, p in s.policy.model.named_parameters() if p.requires_grad}
    assert trainable == {n for n in before if "lora_" in n}


def test_reference_is_the_base_model_with_the_adapter_off(tiny_model_dir, data_file, tmp_path):
    s = setup(make_config(tiny_model_dir, data_file, tmp_path / "run", *LORA))
    assert s.policy.reference is None
    training_step(s, 1)  # the adapter's B matrices start at 0; one step makes them matter
    rows = s.data.batch(1, 3)
    rollout = s.sampler.generate_ids(
        [r["prompt_ids"] for r in rows], 2, SamplingParams(max_new_tokens=6, seed=3)
    )
    batch = TrainBatch(
        rollout.input_ids,
        rollout.attention_mask,
        rollout.completion_mask,
        advantages=torch.zeros(rollout.num_rows),
    )
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    forward = ForwardSettings(1.0, 64, 8)
    expected = batch_logprobs(PolicyLogprobs(base), batch, forward)
    adapted = batch_logprobs(s.policy.train_forward, batch, forward)
    reference = s.policy.reference_logprobs(batch)
    torch.testing.assert_close(reference, expected, atol=1e-6, rtol=0)
    assert float((adapted - expected).abs().max()) > 1e-4


def test_merged_final_generates_what_the_adapted_model_generates(
    tiny_model_dir,
    data_file,
    tmp_path,
):
    run_dir = tmp_path / "run"
    config = make_config(tiny_model_dir, data_file, run_dir, *LORA, "model.lora.save_adapter=true")
    train(config, quiet=True)
    merged = transformers.AutoModelForCausalLM.from_pretrained(run_dir / "final").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(run_dir / "final")
    peft = pytest.importorskip("peft")
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    adapted = peft.PeftModel.from_pretrained(base, run_dir / "final" / "adapter").eval()
    prompt = tokenizer(["3+4=", "12+9="], return_tensors="pt", padding=True)
    settings = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False}
    assert torch.equal(
        merged.generate(**prompt, **settings), adapted.generate(**prompt, **settings)
    )
    assert not any("lora" in name for name in merged.state_dict())


def test_resuming_a_finished_run_with_save_adapter_writes_the_adapter(
    tiny_model_dir, data_file, tmp_path, capsys
):
    """model.lora.save_adapter changes neither the weights nor the optimizer's state, only what
    final/ holds: a finished run resumed with it set writes final/adapter, and says so."""
    run_dir = tmp_path / "run"
    base = (*LORA, "run.steps=1", "run.save_every=1")
    train(make_config(tiny_model_dir, data_file, run_dir, *base), quiet=True)
    assert not (run_dir / "final" / "adapter").exists()
    capsys.readouterr()
    resume = ("run.resume=auto", "model.lora.save_adapter=true")
    train(make_config(tiny_model_dir, data_file, run_dir, *base, *resume), quiet=True)
    assert (run_dir / "final" / "adapter" / "adapter_config.json").is_file()
    err = capsys.readouterr().err
    assert "resuming at step 1 with changed settings: model.lora.save_adapter False -> True" in err
    assert "save_adapter: true" in (run_dir / "config.yaml").read_text()


def test_checkpoints_hold_the_adapter_and_resume_restores_it(tiny_model_dir, data_file, tmp_path):
    run_dir = tmp_path / "run"
    config = make_config(
        tiny_model_dir, data_file, run_dir, *LORA, "run.save_every=1", "run.keep_last=3"
    )
    train(config, quiet=True)
    first = run_dir / "checkpoints" / "step-000001"
    saved = load_file(first / "model.safetensors")
    adapter = set(saved)
    # the adapter alone: the frozen base weights come from model.path on resume
    assert adapter and all("lora_" in name for name in adapter)
    assert all(saved[n].abs().sum() > 0 for n in adapter if "lora_B" in n)
    branch = f"run.resume={first}", "run.overwrite=true"  # its later checkpoints dropped
    resumed = setup(make_config(tiny_model_dir, data_file, run_dir, *LORA, *branch))
    assert resumed.start_step == 1
    state = resumed.policy.model.state_dict()
    for name in adapter:
        assert torch.equal(state[name], saved[name]), name
    # AdamW moments exist for the adapter parameters only
    moments = [
        resumed.optimizer.state[p] for p in resumed.policy.model.parameters() if p.requires_grad
    ]
    assert all(float(m["step"]) == 1.0 for m in moments)
    assert len(resumed.optimizer.state) == len(moments)


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ("[q_proj,lm_head]", r"'lm_head' is the output head, which an adapter cannot train"),
        ("[embed_tokens]", r"'embed_tokens' is an embedding tied to the output head"),
        ("[q_proj,qkv_proj]", r"qkv_proj match no module of this model \(its linear layers: "),
        (
            "[mlp]",
            r"'mlp' is a Qwen2MLP, which LoRA cannot adapt; name linear layers \(this "
            r"model's: down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj\)$",
        ),
        ("[q_proj,norm]", r"'norm' is a Qwen2RMSNorm, which LoRA cannot adapt; name linear "),
    ],
)
def test_targets_an_adapter_could_not_train_are_one_line(tiny_model_dir, data_file, tmp_path,
                                                         targets, message):  # fmt: skip
    """The head's weight is read by the forward itself (an adapter there never trains), a tied
    embedding's adapter would change the head when merged, a name that matches nothing leaves
    part of the model without adapters, and a block or a norm is no layer peft adapts (its
    refusal quotes the module's multi-line repr)."""
    config = make_config(
        tiny_model_dir, data_file, tmp_path / "run", *LORA, f"model.lora.target_modules={targets}"
    )
    with pytest.raises(UserError, match=f"^model.lora.target_modules: {message}"):
        setup(config)


def test_a_lora_dropout_is_said_to_do_nothing(tiny_model_dir, data_file, tmp_path, capsys):
    """Every forward of a step runs without dropout (the update's ratios compare like with
    like): a dropout set is said at start, not silently ignored."""
    setup(make_config(tiny_model_dir, data_file, tmp_path / "run", *LORA, "model.lora.dropout=0.1"))
    assert "warning: model.lora.dropout=0.1 does nothing" in capsys.readouterr().err


def test_the_adapter_of_a_hub_model_names_its_id_and_commit(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    """final/adapter/adapter_config.json names the base as the Hub id at the commit the run
    loaded, not the Hugging Face cache folder it was read from on this machine; peft's
    `AutoPeftModelForCausalLM` loads the adapter on its base from there. Saving it asks the
    Hub nothing."""
    peft = pytest.importorskip("peft")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf-cache" / "models--acme--tiny"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    run_dir = tmp_path / "run"
    extra = ("run.steps=1", "model.lora.save_adapter=true", "eval.at_start_end=false")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(make_config("acme/tiny", data_file, run_dir, *LORA, *extra), quiet=True)
    # saving the adapter looks nothing up on the Hub (peft's check for a resized vocabulary)
    assert not [w for w in caught if "acme/tiny" in str(w.message)]
    adapter = run_dir / "final" / "adapter"
    stated = json.loads((adapter / "adapter_config.json").read_text())
    assert (stated["base_model_name_or_path"], stated["revision"]) == ("acme/tiny", commit)
    loaded = peft.AutoPeftModelForCausalLM.from_pretrained(adapter).eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(run_dir / "final").eval()
    ids = torch.tensor([[1, 20, 30, 40]])
    torch.testing.assert_close(loaded(ids).logits, merged(ids).logits, atol=1e-5, rtol=0)
