"""What a resume does with settings that differ from its checkpoint's.

A checkpoint keeps the settings the run trained with (`config`, as config.yaml has them) and the
history of the changes made on earlier resumes. On a resume every setting is compared with
them, and the held-out rows with the ones the run evaluated on (`EVAL_ROWS`): a change that
cannot apply within one run (`FIXED`: the model, what the data is and how it is drawn, the
group size, the seed, but not whether final/ holds a LoRA adapter alone; and fewer steps than
are done) is refused in one line naming it, unless `run.force_changes` names it
(`FORCEABLE`), and so is an `algo.estimator` changed to or from the critic's (a value model the
checkpoint lacks or would drop); any other change is in effect from the resumed step and said,
the optimizer's own hyperparameters included (its saved state would otherwise keep the old
ones).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import torch

# Settings that define what the run is: a resume that changes one is another run.
FIXED = (
    "model.path",
    "model.revision",
    "model.dtype",
    "model.trust_remote_code",
    "model.lora.",
    "data.",
    "rollout.group_size",
    "run.seed",
)
# Settings under a `FIXED` prefix that leave the weights and the optimizer's state as they are,
# saying only what final/ holds: changed on a resume like any other setting (a finished run
# resumed with it writes its final/ again).
UNFIXED = ("model.lora.save_adapter",)
# What `run.force_changes` may name: a moved or re-fetched model, other data (`data.rows`: the
# training rows' fingerprint), another group size or seed. The model's dtype and adapters stay
# fixed: the checkpoint's weights and optimizer state would not fit them.
FORCEABLE = ("model.path", "model.revision", "data.", "rollout.group_size", "run.seed")
DATA_ROWS = "data.rows"
# The held-out rows' fingerprint, said as a changed setting where `eval.path` names other rows
# than the checkpoint's under the same name (another `eval_dataset`, an edited file)
EVAL_ROWS = "eval.rows"
ESTIMATOR = "algo.estimator"
# The estimator that trains a value model: a checkpoint holds one exactly when it was saved with
# it, so a resume can neither switch to it (no value model to load) nor from it (a trained one
# dropped)
CRITIC_ESTIMATOR = "gae"
# How this process was started, not what the run is.
PROCEDURAL = ("run.resume", "run.overwrite", "run.dir", "run.force_changes")


def flatten(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"optim": {"lr": 1e-4}}` as `{"optim.lr": 1e-4}`."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def changed_settings(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, list[Any]]:
    """The settings whose value differs, by dotted name: `[saved, current]`; procedural ones
    (`run.resume`, `run.overwrite`, `run.dir`) left out."""
    before, after = flatten(saved), flatten(current)
    return {
        key: [before.get(key), after.get(key)]
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key) and key not in PROCEDURAL
    }


def forceable(key: str) -> bool:
    """Whether `run.force_changes` may name the setting `key` (or `data.rows`)."""
    return key.startswith(FORCEABLE) or key in FORCEABLE


def refusal(
    changes: dict[str, list[Any]],
    done: int,
    steps: int,
    fingerprints: tuple,
    forced: Iterable[str] = (),
    rows_why: str | None = None,
) -> str | None:
    """Why a resume with `changes` cannot continue its run (None when it can): a `FIXED`
    setting changed and not `forced`, `algo.estimator` changed to or from `CRITIC_ESTIMATOR`,
    `run.steps` below the `done` steps, or the training rows' fingerprint (saved, current)
    differing (a data file edited or shuffled between the runs, or what `rows_why` says where
    the caller knows why) without `data.rows` forced."""
    forced = set(forced)
    for key, (old, new) in changes.items():
        if (key.startswith(FIXED) or key in FIXED) and key not in (*forced, *UNFIXED):
            force = f", force it with run.force_changes=[{key}]" if forceable(key) else ""
            return (
                f"{key} was {old!r} and is now {new!r}: it cannot change within a run; resume "
                f"with {key}={_override(old)}{force}, or start a new run.dir"
            )
        if key == ESTIMATOR and (old == CRITIC_ESTIMATOR) != (new == CRITIC_ESTIMATOR):
            return (
                f"{key} was {old!r} and is now {new!r}: a run cannot gain or drop the value "
                f"model of {CRITIC_ESTIMATOR}; resume with {key}={_override(old)}, or start a "
                "new run.dir"
            )
    if steps < done:
        return f"run.steps={steps} is below the {done} steps the checkpoint has done"
    saved, current = fingerprints
    if saved is not None and saved != current and DATA_ROWS not in forced:
        return rows_why or (
            "the training rows differ from the ones the run started with (the data was edited "
            f"or reordered): restore them, force it with run.force_changes=[{DATA_ROWS}], or "
            "start a new run.dir"
        )
    return None


# Marks a digest of whole rows; a checkpoint's digest without it is of prompt and answer alone
ROWS_DIGEST = "rows:"


def data_fingerprint(rows: Iterable[dict[str, Any]]) -> str:
    """A digest of the training (or held-out) rows in their order, every column of each (an
    edited `tests` or `hint` column changes what the rewards read), marked `ROWS_DIGEST`."""
    digest = hashlib.sha256()
    for row in rows:
        text = json.dumps(row, sort_keys=True, default=repr, ensure_ascii=False)
        digest.update(text.encode() + b"\0")
    return ROWS_DIGEST + digest.hexdigest()


def prompt_answer_fingerprint(rows: Iterable[dict[str, Any]]) -> str:
    """The digest a checkpoint of an older version holds: prompt and answer of each row."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(f"{row.get('prompt')!r}\0{row.get('answer')!r}\0".encode())
    return digest.hexdigest()


def apply_optimizer_settings(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
) -> None:
    """Put `lr`, `betas` and `weight_decay` into `optimizer`'s param groups after its state was
    loaded, and the learning rate of the step under way, by `scheduler`'s (possibly changed)
    schedule, into them too."""
    for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group["initial_lr"] = lr
        group["lr"] = lr * factor(scheduler.last_epoch)
        group["betas"] = betas
        group["weight_decay"] = weight_decay
    # through the schedule's state: what it logs as this step's rate (`get_last_lr`) and scales
    state = scheduler.state_dict()
    state["base_lrs"] = [lr] * len(optimizer.param_groups)
    state["_last_lr"] = [group["lr"] for group in optimizer.param_groups]
    scheduler.load_state_dict(state)


def _override(value: Any) -> str:
    """`value` as an override that gives it back: a text with a line break or a tab in double
    quotes (an override reads a quoted text as YAML), which keeps the refusal one line."""
    if isinstance(value, str) and not value.isprintable():
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return "null" if value is None else str(value)
