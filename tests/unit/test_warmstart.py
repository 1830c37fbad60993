import json
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from oncurve.model.char_tokenizer import char_tokenizer
from oncurve.warmstart import encode_sft, warmstart

TINY = {
    "batch_size": 16,
    "lr": 3e-3,
    "warmup_steps": 5,
    "hidden_size": 32,
    "num_layers": 2,
    "intermediate_size": 64,
    "eval_prompts": 8,
    "log": lambda line: None,
}


def umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_encode_sft_puts_the_loss_on_the_completion_and_eos_only():
    tokenizer = char_tokenizer()
    rows = [
        {"prompt": "1+2=", "solution": " 03 <answer>3</answer>"},
        {"prompt": "10+25=", "solution": " 05 03 <answer>35</answer>"},
    ]
    input_ids, attention_mask, labels = encode_sft(tokenizer, rows)
    for i, row in enumerate(rows):
        n_prompt = len(row["prompt"]) + 1  # <bos>
        n = n_prompt + len(row["solution"]) + 1  # <eos>
        assert input_ids[i, 0] == tokenizer.bos_token_id
        assert input_ids[i, n - 1] == tokenizer.eos_token_id
        assert attention_mask[i].sum() == n
        assert (labels[i, :n_prompt] == -100).all()
        assert torch.equal(labels[i, n_prompt:n], input_ids[i, n_prompt:n])
        assert (labels[i, n:] == -100).all()
        assert tokenizer.decode(labels[i, n_prompt : n - 1]) == row["solution"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # A model this small runs far slower on several OpenMP threads than on one when other jobs
    # share the cores: its threads spend the step waiting for each other.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("warm")
    return out, warmstart(out, steps=20, seed=1, **TINY)


def test_recipe_output_loads_and_its_loss_fell(tiny_run):
    out, result = tiny_run
    assert len(result.losses) == 20
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < 0.8 * first
    assert 0.0 <= result.accuracy <= 1.0
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert tokenizer.pad_token_id is not None and tokenizer.bos_token_id is not None
    assert (out / "model.safetensors").is_file()
    prompt = tokenizer(["12+34="], return_tensors="pt")["input_ids"]
    generated = model.generate(prompt, do_sample=False, max_new_tokens=4)
    assert torch.equal(generated[:, : prompt.shape[1]], prompt)


def test_card_records_the_command_and_the_measured_accuracy(tiny_run):
    out, result = tiny_run
    card = (out / "README.md").read_text()
    assert "oncurve warmstart --out NEW_DIR --steps 20 --seed 1" in card
    recipe = json.loads(card.split("Recipe: ", 1)[1])
    assert recipe["test_accuracy"] == result.accuracy
    assert recipe["final_loss"] == result.losses[-1]
    # what rebuilds it: the sizes it was trained at, the torch and the threads it summed with
    sizes = {k: recipe[k] for k in ("hidden_size", "num_layers", "intermediate_size")}
    assert sizes == {k: TINY[k] for k in sizes} and recipe["threads"] == 1
    assert recipe["torch"] == torch.__version__
    # written with the umask's modes, as a run's final model is
    assert all((p.stat().st_mode & 0o777) == 0o666 & ~umask() for p in out.iterdir())


def test_same_seed_rebuilds_the_same_weights(tiny_run, tmp_path):
    out, result = tiny_run
    again = warmstart(tmp_path, steps=20, seed=1, **TINY)
    assert again.losses == result.losses
    first, second = load_file(out / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_bad_budget_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="steps must be at least 1"):
        warmstart(tmp_path, steps=0, **TINY)


def test_a_directory_that_is_not_empty_is_refused_before_training(tmp_path):
    (tmp_path / "README.md").write_text("mine")
    with pytest.raises(ValueError, match=r"exists and is not an empty directory"):
        warmstart(tmp_path, steps=20, **TINY)
    assert (tmp_path / "README.md").read_text() == "mine"


def test_a_directory_filled_while_training_is_kept_and_the_model_is_kept_beside_it(
    tmp_path, monkeypatch
):
    import oncurve.warmstart as recipe

    out = tmp_path / "model"

    def another_writer(model, tokenizer, rows):  # runs after training, before the save
        out.mkdir(exist_ok=True)
        (out / "model.safetensors").write_text("another run's")
        return 0.5

    monkeypatch.setattr(recipe, "greedy_accuracy", another_writer)
    with pytest.raises(ValueError, match=r"written meanwhile by something else, and is kept"):
        warmstart(out, steps=2, **TINY)
    assert (out / "model.safetensors").read_text() == "another run's"
    [kept] = [p for p in tmp_path.iterdir() if p.name.startswith(".model.")]
    assert (kept / "model.safetensors").is_file() and (kept / "README.md").is_file()


def test_an_empty_directory_keeps_its_mode_and_a_link_to_one_is_written_through(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    warmstart(private, steps=1, **TINY)
    assert (private.stat().st_mode & 0o777) == 0o700 and (private / "model.safetensors").is_file()
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    warmstart(tmp_path / "link", steps=1, **TINY)
    assert (tmp_path / "target" / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "private", "target"]


def test_a_directory_below_a_file_is_refused_before_training(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match=r"afile is a file: no directory .*sub can be made"):
        warmstart(tmp_path / "afile" / "sub", steps=10**6, **TINY)


def test_max_digits_trains_and_evaluates_on_longer_sums(tmp_path, monkeypatch):
    import oncurve.warmstart as recipe

    prompts: list[str] = []

    def recorded(tokenizer, rows):
        prompts.extend(row["prompt"] for row in rows)
        return encode_sft(tokenizer, rows)

    monkeypatch.setattr(recipe, "encode_sft", recorded)
    warmstart(tmp_path, steps=2, max_digits=6, device="cpu", **TINY)
    assert len(prompts) == 2 * TINY["batch_size"]
    assert all(len(p) == len("000030+000008=") for p in prompts), prompts[:3]


def test_stop_at_ends_training_at_the_first_check_that_reaches_it(tmp_path):
    lines: list[str] = []
    options = TINY | {"log": lines.append}
    result = warmstart(tmp_path, steps=20, stop_at=0.0, check_every=5, **options)
    assert len(result.losses) == 5  # every accuracy is at least 0: the first check stops it
    assert any("step 5: accuracy" in line for line in lines)
    assert '"steps": 5' in (tmp_path / "README.md").read_text()
