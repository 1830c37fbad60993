"""The peers' answer checkers, run as `python -m harness.peer_child WANTED` in the peers'
environment (`answer_checkers.py`; no oncurve on its path): imports each checker named in
`WANTED` (JSON, {checker: the set it runs on, or null for every set}) from its installed
package, writes one JSON line saying which loaded ({"loaded", "failed", "versions"}), then
reads {"id", "set", "gold", "prompt", "completion"} JSON lines on stdin and writes
{"id", "verdicts", "errors", "seconds"} for each (`score_row`). A checker that cannot be
imported is reported in "failed" and the others run; one that raises on a row gives no verdict
there.

How each is called: verl's package `__init__` imports torch and Ray, so verl's reward modules
are imported without it (`verl_scores`); verl's `math_verify.compute_score` runs its check in a
spawned process pool, so the child calls the function that pool runs with compute_score's own
gold, `\\boxed{gold}`. TRL's `accuracy_reward` gets the gold as the last line of a MATH
solution, `\\boxed{gold}` (a gold it cannot parse returns None: unpaid, and no verdict).
math-verify gets `parse(\\boxed{gold})` against `parse(completion)`, as lm-eval's minerva_math
passes the solution. lm-eval's gsm8k reference is `#### gold` (its `doc_to_target` is GSM8K's
answer text, whose `#### ` its `regexes_to_ignore` strip)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
import time
import types
from collections.abc import Callable
from importlib.resources import files
from typing import Any

Check = Callable[[dict[str, Any]], bool | None]
VERSIONED = ("math-verify", "latex2sympy2_extended", "trl", "verl", "lm_eval", "sympy")


def boxed(gold: str) -> str:
    return "\\boxed{" + gold + "}"


def verl_scores() -> types.ModuleType:
    """verl's reward_score package without verl's `__init__`, which imports torch and Ray:
    `verl`, `verl.utils` and `verl.utils.reward_score` registered as bare packages over the
    installed folders, and `verl.utils.metric` (torch-only; prime_math's timeout helper wants a
    type from it) as a stub."""
    if "verl" not in sys.modules:
        for name in ("verl", "verl.utils", "verl.utils.reward_score"):
            spec = importlib.util.find_spec(name)
            assert spec is not None and spec.submodule_search_locations is not None
            module = types.ModuleType(name)
            module.__path__ = list(spec.submodule_search_locations)
            sys.modules[name] = module
        metric = types.ModuleType("verl.utils.metric")
        metric.Metric = type("Metric", (), {})  # type: ignore[attr-defined]
        sys.modules["verl.utils.metric"] = metric
    return importlib.import_module("verl.utils.reward_score")


def math_verify() -> Check:
    """math-verify's `parse(\\boxed{gold})` against `parse(completion)`, as lm-eval's
    minerva_math passes the solution."""
    from math_verify import parse, verify

    return lambda row: verify(gold=parse(boxed(row["gold"])), target=parse(row["completion"]))


def verl_math_verify() -> Check:
    """The function compute_score's process pool runs (its workers would import verl's
    `__init__`), with compute_score's own gold."""
    from verl.utils.reward_score import math_verify as module

    return lambda row: module._verify_in_subprocess(boxed(row["gold"]), row["completion"]) == 1.0


def verl_module(name: str, paid: Callable[[Any], bool]) -> Callable[[], Check]:
    """verl's reward module `name`, its `compute_score(completion, gold)` read by `paid`."""

    def make() -> Check:
        module = importlib.import_module(f"verl.utils.reward_score.{name}")
        return lambda row: paid(module.compute_score(row["completion"], row["gold"]))

    return make


def trl_accuracy() -> Check:
    """TRL's `accuracy_reward` with the gold as a MATH solution's last line; None (no reward)
    when it cannot parse the gold."""
    from trl.rewards import accuracy_reward

    def check(row: dict[str, Any]) -> bool | None:
        completion = [[{"role": "assistant", "content": row["completion"]}]]
        reward = accuracy_reward(completion, [boxed(row["gold"])])[0]
        return None if reward is None else reward == 1.0

    return check


def lm_eval_gsm8k(filter_name: str) -> Callable[[], Check]:
    """lm-eval's gsm8k filter `filter_name` and its `exact_match` metric, as the installed
    task yaml configures them, against the reference `#### gold`."""

    def make() -> Check:
        import yaml
        from lm_eval.api.metrics import exact_match_hf_evaluate
        from lm_eval.filters.extraction import RegexFilter
        from lm_eval.filters.selection import TakeFirstFilter

        task = yaml.safe_load(files("lm_eval").joinpath("tasks/gsm8k/gsm8k.yaml").read_text())
        (metric,) = [m for m in task["metric_list"] if m["metric"] == "exact_match"]
        dropped = ("metric", "aggregation", "higher_is_better")
        options = {k: v for k, v in metric.items() if k not in dropped}
        (chosen,) = [f for f in task["filter_list"] if f["name"] == filter_name]
        kinds = {"regex": RegexFilter, "take_first": TakeFirstFilter}
        steps = [kinds[step.pop("function")](**step) for step in chosen["filter"]]

        def check(row: dict[str, Any]) -> bool:
            responses: Any = [[row["completion"]]]
            for step in steps:
                responses = list(step.apply(responses, [None]))
            prediction = responses[0] if isinstance(responses[0], str) else responses[0][0]
            reference = "#### " + row["gold"]
            score = exact_match_hf_evaluate(
                predictions=[prediction], references=[reference], **options
            )
            return score["exact_match"] == 1.0

        return check

    return make


MAKERS: dict[str, Callable[[], Check]] = {
    "math_verify": math_verify,
    "verl_math_verify": verl_math_verify,
    "verl_math_reward": verl_module("math_reward", lambda score: score == 1.0),
    "verl_prime_math": verl_module("prime_math", lambda score: bool(score[0])),
    "verl_math_dapo": verl_module("math_dapo", lambda score: bool(score["acc"])),
    "trl_accuracy": trl_accuracy,
    "verl_gsm8k": verl_module("gsm8k", lambda score: score == 1.0),
    "lm_eval_gsm8k_strict": lm_eval_gsm8k("strict-match"),
    "lm_eval_gsm8k_flexible": lm_eval_gsm8k("flexible-extract"),
}


def version(dist: str) -> str | None:
    """The installed version of distribution `dist`, None when it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def score_row(
    checks: dict[str, Check],
    only: dict[str, str | None],
    row: dict[str, Any],
    catch: tuple[type[Exception], ...] = (Exception,),
) -> dict[str, dict[str, Any]]:
    """{"verdicts", "errors", "seconds"}, each by checker, of the `checks` that run on `row`'s
    set (`only`: the one set each runs on, or None for all): a verdict (None: no verdict), the
    error of one that raised `catch` (no verdict), and the seconds of its call."""
    scored: dict[str, dict[str, Any]] = {"verdicts": {}, "errors": {}, "seconds": {}}
    for key, check in checks.items():
        if only[key] not in (None, row["set"]):
            continue
        start = time.perf_counter()
        try:
            verdict = check(row)
            scored["verdicts"][key] = None if verdict is None else bool(verdict)
        except catch as e:  # scored unpaid, the error kept
            scored["verdicts"][key] = None
            scored["errors"][key] = f"{type(e).__name__}: {e}"[:200]
        scored["seconds"][key] = time.perf_counter() - start
    return scored


def main() -> None:
    wanted: dict[str, str | None] = json.loads(sys.argv[1])
    peers: dict[str, Check] = {}
    failed: dict[str, str] = {}
    for key in wanted:
        try:
            if key.startswith("verl"):
                verl_scores()
            peers[key] = MAKERS[key]()
        except Exception as e:  # a peer that cannot be imported is reported, the others run
            failed[key] = f"{type(e).__name__}: {e}"
    versions = {dist: version(dist) for dist in VERSIONED}
    print(json.dumps({"loaded": list(peers), "failed": failed, "versions": versions}), flush=True)
    for line in sys.stdin:
        row = json.loads(line)
        print(json.dumps({"id": row["id"], **score_row(peers, wanted, row)}), flush=True)


if __name__ == "__main__":
    main()
