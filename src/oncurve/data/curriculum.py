"""Curriculum (`data.curriculum`): which training prompts a step samples.

A group whose G answers are all right or all wrong has zero advantage: its rollouts teach
nothing, and on a hard task most groups are such. Two samplers spend fewer rollouts on them:

- `pass_rate`: each training prompt keeps a running pass rate from its own groups (each visit
  moves it halfway to that visit's rate, so the last visits count most). A prompt is drawn with
  weight 1 until it is tried, then with the chance that a group of G at its rate has answers
  neither all right nor all wrong, 1 - p^G - (1-p)^G, but never below `data.curriculum_floor`:
  prompts that every completion or none solved in their last visits are drawn at the floor, so
  they are still tried again now and then.
- `difficulty`: the rows of a task's difficulty levels (`tasks.base.LeveledTask`), drawn from
  the current level only, starting at the easiest. The level goes up once the sampled accuracy
  of its last `WINDOW` steps reaches `data.curriculum_threshold`.

Both are weights over the training rows (`PromptData.rows`). A step's prompts are drawn from
them by a generator seeded with (run seed, step), without replacement while rows with weight
are left and then with replacement: a difficulty level with fewer rows than a step takes
repeats prompts within the step (`curriculum_notes`, said at start). Every rank draws the same
prompts and a resumed run draws what an uninterrupted one draws, given the state, which
checkpoints keep (`state_dict`). The state moves once per step, from the pass rates of every
group of every rank and sampling round (`gather_pass_rates`), so it is the same on every rank.
A saved state is loaded only into the rows it fits (`load_state_dict`): pass rates of as many
rows as the run has, a level its rows have, the same curriculum; else a `UserError`.

The state and the pass rates live on the CPU whatever the model's device: they pick Python
rows, are summed across ranks as lists, and go into the checkpoint's JSON.

A group's pass rate is the mean of its finite verifier scores (the reward evaluation calls
correct), or of its total rewards where the run has no verifier, clipped to [0, 1]; a group
without a finite score leaves no record.
"""

from __future__ import annotations

import abc
import math

import torch

from oncurve import distributed
from oncurve.config import Config
from oncurve.errors import UserError

# The weight of a visit's pass rate in a prompt's running rate: a prompt's last visits decide
# whether it is set aside, as a model that learns leaves its old verdicts behind.
RATE_DECAY = 0.5
# Steps at a level whose pooled sampled accuracy decides a difficulty step: one lucky step of
# B groups is too noisy a reason to move on.
WINDOW = 8


def group_pass_rates(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """`[B]` float64 pass rate of each group of `scores` `[B*G]`: the mean of its non-NaN
    scores clipped to [0, 1]; NaN for a group without one."""
    grouped = scores.detach().to("cpu", torch.float64).view(-1, group_size)
    return grouped.nanmean(1).clamp(0.0, 1.0)


def running_rates(
    rates: torch.Tensor, rows: torch.Tensor, visits: torch.Tensor, decay: float = RATE_DECAY
) -> torch.Tensor:
    """`[R]` pass rates (NaN: never tried) after row `rows[i]` scored `visits[i]`, in order
    (a row may come twice): a first visit sets the rate, a later one moves it by `decay`
    toward the visit's, rate + decay * (visit - rate). `rates` is not changed."""
    out = rates.clone()
    for row, visit in zip(rows.tolist(), visits.tolist(), strict=True):
        old = float(out[row])
        out[row] = visit if math.isnan(old) else old + decay * (visit - old)
    return out


def informative_chance(rates: torch.Tensor, group_size: int) -> torch.Tensor:
    """`[R]` chance that G completions at pass rate p are neither all right nor all wrong
    (their group has an advantage): 1 - p^G - (1-p)^G; NaN where p is."""
    return 1 - rates.pow(group_size) - (1 - rates).pow(group_size)


def pass_rate_weights(rates: torch.Tensor, group_size: int, floor: float) -> torch.Tensor:
    """`[R]` sampling weights of the prompts of pass rates `rates` (NaN: never tried): 1 for an
    untried prompt, else its `informative_chance`, at least `floor`."""
    chance = informative_chance(rates, group_size).clamp(min=floor)
    return torch.where(rates.isnan(), torch.ones_like(rates), chance)


def draw_rows(weights: torch.Tensor, count: int, generator: torch.Generator) -> list[int]:
    """`count` indices of `weights` `[R]` drawn in proportion to them: without replacement
    while rows with weight are left, then the rest with replacement (so the first draws, a
    step's first round, hold no row twice unless fewer than they have weight)."""
    distinct = min(count, int((weights > 0).sum()))
    picks = torch.multinomial(weights, distinct, replacement=False, generator=generator)
    if count > distinct:
        more = torch.multinomial(weights, count - distinct, replacement=True, generator=generator)
        picks = torch.cat([picks, more])
    return picks.tolist()


def draw_seed(seed: int, step: int) -> int:
    """The seed of step `step`'s draw of prompts: a pure function of (run seed, step)."""
    return (seed * 1_000_033 + step * 7_919 + 104_729) % 2**63


def rolling_accuracy(window: list[tuple[float, int]]) -> float:
    """The pooled pass rate of a window of (sum of group pass rates, groups) steps; NaN when it
    holds no group."""
    groups = sum(count for _, count in window)
    return sum(total for total, _ in window) / groups if groups else math.nan


def steps_up(level: int, levels: int, window: list[tuple[float, int]], threshold: float) -> bool:
    """Whether the difficulty curriculum moves on from `level` of `levels`: a harder level is
    left and the `WINDOW` steps at this one (`window`, full) reach `threshold` together."""
    full = len(window) == WINDOW
    return level < levels - 1 and full and rolling_accuracy(window) >= threshold


def gather_pass_rates(
    visits: list[tuple[int, torch.Tensor]], rounds: int, mine: slice, size: int
) -> torch.Tensor:
    """`[rounds, size]` every rank's group pass rates of a step, by sampling round and position
    in the step's draw, from this rank's `visits` (round, `[mine]` pass rates); NaN where no
    rank sampled (a rank already full in a dynamic-sampling round) or a group had no score.
    Each entry comes from one rank and the others add zeros, so the sum is exact: every rank
    gets the same table."""
    values = torch.zeros(rounds, size, dtype=torch.float64)
    present = torch.zeros(rounds, size, dtype=torch.float64)
    for round_, rates in visits:
        values[round_, mine] = rates.nan_to_num(0.0)
        present[round_, mine] = (~rates.isnan()).double()
    summed = distributed.all_sum(values.flatten().tolist() + present.flatten().tolist())
    both = torch.tensor(summed, dtype=torch.float64).view(2, rounds, size)
    return torch.where(both[1] > 0, both[0], math.nan)


class Curriculum(abc.ABC):
    """Weights over the training rows, a seeded draw from them, and the state they come from,
    updated with each step's pass rates (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    @abc.abstractmethod
    def weights(self) -> torch.Tensor:
        """`[R]` the sampling weight of each training row."""

    @abc.abstractmethod
    def update(self, rows: torch.Tensor, rates: torch.Tensor) -> dict[str, float]:
        """Learn that row `rows[i]` `[k]` passed at `rates[i]` this step, in draw order; returns
        the step's `curriculum/*` metrics."""

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """The state, JSON-able (a checkpoint's `state.json` holds it)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Take `state` (`state_dict`'s); a `UserError` naming the setting when it does not fit
        these rows (a resume that forced other data or another curriculum)."""

    def draw(self, step: int, size: int, round_: int = 0, rounds_per_step: int = 1) -> list[int]:
        """The `size` row indices of sampling round `round_` of step `step`: a slice of one
        draw of `size * rounds_per_step` rows for the whole step, so that dynamic sampling's
        rounds get prompts of their own."""
        generator = torch.Generator().manual_seed(draw_seed(self.seed, step))
        picks = draw_rows(self.weights(), size * rounds_per_step, generator)
        return picks[round_ * size : (round_ + 1) * size]

    def record(self, step: int, rounds_per_step: int, rates: torch.Tensor) -> dict[str, float]:
        """`update` with the step's pass rates `[rounds, size]` (`gather_pass_rates`), each
        matched to the row drawn at its place; call it once per step, after every round."""
        rounds, size = rates.shape
        drawn = [self.draw(step, size, r, rounds_per_step) for r in range(rounds)]
        rows, flat = torch.tensor(drawn).flatten(), rates.flatten()
        scored = ~flat.isnan()
        return self.update(rows[scored], flat[scored])


class PassRateCurriculum(Curriculum):
    """`data.curriculum=pass_rate` over `rows` training rows, for groups of `group_size`.

    Metrics: `curriculum/solved_frac` and `curriculum/unsolved_frac`, the fractions of the
    step's prompts that were set aside (drawn at the floor) as solved by every completion or by
    none when they were drawn, and `curriculum/skipped`, the training prompts set aside after
    the step. A prompt is set aside when its weight is the floor.
    """

    def __init__(self, rows: int, seed: int, group_size: int, floor: float) -> None:
        super().__init__(seed)
        self.group_size = group_size
        self.floor = floor
        self.rates = torch.full((rows,), math.nan, dtype=torch.float64)

    def weights(self) -> torch.Tensor:
        return pass_rate_weights(self.rates, self.group_size, self.floor)

    def update(self, rows: torch.Tensor, rates: torch.Tensor) -> dict[str, float]:
        before = self.rates[rows]
        aside = self._set_aside(before)
        self.rates = running_rates(self.rates, rows, rates)
        drawn = max(len(rows), 1)
        return {
            "curriculum/solved_frac": float((aside & (before > 0.5)).sum()) / drawn,
            "curriculum/unsolved_frac": float((aside & (before < 0.5)).sum()) / drawn,
            "curriculum/skipped": float(self._set_aside(self.rates).sum()),
        }

    def _set_aside(self, rates: torch.Tensor) -> torch.Tensor:
        """Where the weight of prompts of pass rates `rates` is the floor (never untried)."""
        return informative_chance(rates, self.group_size) <= self.floor

    def state_dict(self) -> dict:
        tried = (~self.rates.isnan()).nonzero().flatten()
        return {
            "size": len(self.rates),
            "rows": tried.tolist(),
            "rates": self.rates[tried].tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        if "rates" not in state:
            raise other_curriculum("pass_rate", state)
        rows = torch.tensor(state["rows"], dtype=torch.long, device=self.rates.device)
        count = len(self.rates)
        saved = state.get("size")  # the states of older checkpoints lack it: their rows tell
        if saved is None and len(rows) and not 0 <= int(rows.min()) <= int(rows.max()) < count:
            saved = f"more than {count}"
        if saved is not None and saved != count:
            raise UserError(
                f"data.curriculum=pass_rate: the checkpoint holds the pass rates of {saved} "
                f"training rows and the run has {count}: resume with the training rows it had "
                "(data.num_train, data.rows), or start a new run.dir"
            )
        self.rates = torch.full_like(self.rates, math.nan)
        self.rates[rows] = torch.tensor(state["rates"], dtype=self.rates.dtype, device=rows.device)


class DifficultyCurriculum(Curriculum):
    """`data.curriculum=difficulty` over training rows of difficulty `row_levels` (0 the
    easiest): draws the current level's rows only, and moves up a level when the pooled pass
    rate of its last `WINDOW` steps reaches `threshold`; never down.

    Metrics: `curriculum/level` (the level the step drew from) and `curriculum/accuracy` (the
    rolling sampled accuracy at that level, this step included).
    """

    def __init__(self, row_levels: list[int], seed: int, threshold: float) -> None:
        super().__init__(seed)
        self.row_levels = torch.tensor(row_levels)
        self.levels = int(self.row_levels.max()) + 1
        self.threshold = threshold
        self.level = 0
        self.window: list[tuple[float, int]] = []  # (sum of group pass rates, groups) per step

    def weights(self) -> torch.Tensor:
        return (self.row_levels == self.level).double()

    def update(self, rows: torch.Tensor, rates: torch.Tensor) -> dict[str, float]:
        window = [*self.window, (float(rates.sum()), len(rates))][-WINDOW:]
        metrics = {
            "curriculum/level": float(self.level),
            "curriculum/accuracy": rolling_accuracy(window),
        }
        if steps_up(self.level, self.levels, window, self.threshold):
            self.level, window = self.level + 1, []
        self.window = window
        return metrics

    def state_dict(self) -> dict:
        return {"level": self.level, "window": [list(entry) for entry in self.window]}

    def load_state_dict(self, state: dict) -> None:
        if "level" not in state:
            raise other_curriculum("difficulty", state)
        if not 0 <= int(state["level"]) < self.levels:
            raise UserError(
                f"data.curriculum=difficulty: the checkpoint is at level {state['level']} and the "
                f"run's training rows have levels 0 to {self.levels - 1}: resume with the data "
                "it had, or start a new run.dir"
            )
        self.level = int(state["level"])
        self.window = [(float(total), int(count)) for total, count in state["window"]]


def other_curriculum(kind: str, state: dict) -> UserError:
    """The error for a saved curriculum state that is not `kind`'s (a resume that forced
    `data.curriculum`): each curriculum's state means nothing to another."""
    saved = "difficulty" if "level" in state else "pass_rate" if "rates" in state else None
    if saved is None:
        return UserError(
            f"data.curriculum={kind}: the checkpoint's curriculum state is neither pass_rate's "
            "nor difficulty's: resume from another checkpoint, or start a new run.dir"
        )
    return UserError(
        f"data.curriculum={kind}: the checkpoint holds the state of data.curriculum={saved}, "
        f"which does not fit it: resume with data.curriculum={saved}, or start a new run.dir"
    )


def curriculum_notes(config: Config, rows: list[dict]) -> list[str]:
    """What the start-up report says of the curriculum over the training rows `rows`: the
    difficulty levels with fewer rows than a step takes (its prompts, times the sampling rounds
    of dynamic sampling, which one draw covers), whose steps repeat prompts (the draw goes on
    with replacement once a level's rows are drawn)."""
    data = config.data
    if data.curriculum != "difficulty":
        return []
    rounds = 1 + config.algo.max_resample if config.algo.dynamic_sampling else 1
    per_step = data.prompts_per_step * rounds
    takes = f"data.prompts_per_step={data.prompts_per_step}" + (
        f" x {rounds} sampling rounds" if rounds > 1 else ""
    )
    levels = [row["level"] for row in rows]
    counts = [levels.count(level) for level in range(max(levels, default=-1) + 1)]
    short = {level: count for level, count in enumerate(counts) if count < per_step}
    if not short:
        return []
    if len(set(counts)) == 1:
        return [
            f"data.curriculum=difficulty: each of the {len(counts)} levels has {counts[0]} "
            f"training rows, fewer than {takes}: each step repeats prompts"
        ]
    listed = ", ".join(f"level {level}: {count}" for level, count in short.items())
    return [
        f"data.curriculum=difficulty: {len(short)} of the {len(counts)} levels have fewer "
        f"training rows than {takes} ({listed}): a step at one of them "
        "repeats prompts"
    ]


def build_curriculum(config: Config, rows: list[dict]) -> Curriculum | None:
    """The sampler `data.curriculum` names over the training rows `rows` (with their "level"
    for `difficulty`), or None for `none` (the seeded order of `PromptData.batch`)."""
    data = config.data
    if data.curriculum == "pass_rate":
        return PassRateCurriculum(
            len(rows), config.run.seed, config.rollout.group_size, data.curriculum_floor
        )
    if data.curriculum == "difficulty":
        return DifficultyCurriculum(
            [row["level"] for row in rows], config.run.seed, data.curriculum_threshold
        )
    return None
