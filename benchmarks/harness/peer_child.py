"""Answer checkers against oncurve's `correct` reward: oncurve's, and the peers' in their own
venv (`prepare`) as `python -m harness.peer_child WANTED` (JSON {checker: its one set or null}).
The child writes {"failed", "versions"}, then {"id", "verdicts", "errors", "seconds"} for each
row on stdin; GSM8K golds reach the peers without thousands separators, as verl writes them."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterable
from functools import partial
from importlib.resources import files
from pathlib import Path
from typing import Any

from harness.checkout import BENCHMARKS, ROOT

Check = Callable[[dict[str, Any]], bool | None]
VERSIONED = ("math-verify", "latex2sympy2_extended", "trl", "verl", "lm_eval", "sympy")
SENT = ("id", "set", "gold", "prompt", "completion")
PEERS_VENV = BENCHMARKS / ".venv-peers"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
# math-verify with the ANTLR runtime its LaTeX parser needs (latex2sympy2_extended's
# `antlr4-13-2` extra pins it; math-verify 0.9 has no such extra), and what the peers' checker
# modules import; the peers' own packages then without their dependencies (torch,
# transformers, Ray, datasets...), which the checker modules do not need.
PEER_REQUIREMENTS = [
    "math-verify",
    "antlr4-python3-runtime==4.13.2",
    "pylatexenc",  # verl prime_math
    "packaging",  # trl.import_utils
    "numpy",  # verl py_functional, lm-eval metrics
    "typing_extensions",
    "sacrebleu",  # imported at the top of lm_eval.api.metrics
    "pyyaml",  # to read lm-eval's gsm8k task yaml
]
PEER_PACKAGES_NO_DEPS = ["trl", "verl", "lm_eval"]


def boxed(gold: str) -> str:
    return "\\boxed{" + gold + "}"


def verl_scores() -> None:
    """Make verl's reward modules importable without its `__init__` (torch, Ray): its packages
    registered bare, `verl.utils.metric` (which prime_math wants a type from) a stub."""
    if "verl" in sys.modules:
        return
    for name in ("verl", "verl.utils", "verl.utils.reward_score"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations is not None
        module = types.ModuleType(name)
        module.__path__ = list(spec.submodule_search_locations)
        sys.modules[name] = module
    metric = types.ModuleType("verl.utils.metric")
    metric.Metric = type("Metric", (), {})  # type: ignore[attr-defined]
    sys.modules["verl.utils.metric"] = metric


def math_verify() -> Check:
    """math-verify's `parse(\\boxed{gold})` against `parse(completion)`, as lm-eval's
    minerva_math passes the solution."""
    from math_verify import parse, verify

    return lambda row: verify(gold=parse(boxed(row["gold"])), target=parse(row["completion"]))


def verl_math_verify() -> Check:
    """What verl's `math_verify.compute_score` runs in its process pool, on `\\boxed{gold}`."""
    from verl.utils.reward_score import math_verify as module

    return lambda row: module._verify_in_subprocess(boxed(row["gold"]), row["completion"]) == 1.0


def verl_module(name: str, paid: Callable[[Any], bool]) -> Check:
    """verl's reward module `name`, its `compute_score(completion, gold)` read by `paid`."""
    module = importlib.import_module(f"verl.utils.reward_score.{name}")
    return lambda row: paid(module.compute_score(row["completion"], row["gold"]))


def trl_accuracy() -> Check:
    """TRL's `accuracy_reward` with the gold as a MATH solution's last line; None (no reward)
    when it cannot parse the gold."""
    from trl.rewards import accuracy_reward

    def check(row: dict[str, Any]) -> bool | None:
        completion = [[{"role": "assistant", "content": row["completion"]}]]
        reward = accuracy_reward(completion, [boxed(row["gold"])])[0]
        return None if reward is None else reward == 1.0

    return check


def lm_eval_gsm8k(filter_name: str) -> Check:
    """lm-eval's gsm8k filter `filter_name` and `exact_match`, as its task yaml sets them,
    against the reference `#### gold`."""
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
        score = exact_match_hf_evaluate(predictions=[prediction], references=[reference], **options)
        return score["exact_match"] == 1.0

    return check


MAKERS: dict[str, Callable[[], Check]] = {
    "math_verify": math_verify,
    "verl_math_verify": verl_math_verify,
    "verl_math_reward": partial(verl_module, "math_reward", lambda score: score == 1.0),
    "verl_prime_math": partial(verl_module, "prime_math", lambda score: bool(score[0])),
    "verl_math_dapo": partial(verl_module, "math_dapo", lambda score: bool(score["acc"])),
    "trl_accuracy": trl_accuracy,
    "verl_gsm8k": partial(verl_module, "gsm8k", lambda score: score == 1.0),
    "lm_eval_gsm8k_strict": partial(lm_eval_gsm8k, "strict-match"),
    "lm_eval_gsm8k_flexible": partial(lm_eval_gsm8k, "flexible-extract"),
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
    """{"verdicts", "errors", "seconds"} by checker of the `checks` that run on `row`'s set
    (`only`; None: all); one raising `catch` gives no verdict and its error."""
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


def tally(pairs: Iterable[tuple[bool | None, bool]]) -> dict[str, int]:
    """Counts tp, fp, fn, tn of (verdict, label) pairs, a None verdict unpaid and "skipped"."""
    counts = dict.fromkeys(("tp", "fp", "fn", "tn", "skipped"), 0)
    for verdict, label in pairs:
        counts["skipped"] += verdict is None
        counts[("t" if bool(verdict) == label else "f") + ("p" if verdict else "n")] += 1
    return counts


def oncurve_checks() -> dict[str, Check]:
    """oncurve's `correct` reward, "strict" and "lenient", as the trainer calls it on a row:
    paid or not, None when it leaves the row unscored or times out."""
    from oncurve.rewards.registry import answer_match_reward, lenient_answer_match_reward

    def check(reward: Callable[..., list[float | None]]) -> Check:
        def verdict(row: dict[str, Any]) -> bool | None:
            try:
                (score,) = reward([row["prompt"]], [row["completion"]], answer=[row["gold"]])
            except TimeoutError:
                return None
            return None if score is None else score == 1.0

        return verdict

    return {"strict": check(answer_match_reward), "lenient": check(lenient_answer_match_reward)}


def prepare() -> None:
    """Create `PEERS_VENV` and install the peers' checkers into it from PyPI."""
    if not PEERS_PYTHON.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    pip = [str(PEERS_PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *PEER_REQUIREMENTS], check=True)
    for package in PEER_PACKAGES_NO_DEPS:  # each alone: one that fails leaves the others
        if subprocess.run([*pip, "--no-deps", package]).returncode:
            print(f"could not install {package}; it will be reported as not run")
    print(f"peers' environment ready: {PEERS_VENV}")
    subprocess.run([*pip[:3], "list", "--format=freeze"], check=True)


def score_in_peers(
    rows: list[dict[str, Any]],
    wanted: dict[str, str | None],
    work: Path,
    python: Path = PEERS_PYTHON,
) -> dict[str, Any]:
    """Score `rows` with the `wanted` peers in this module's child under `python` in `work`,
    adding to each row's "verdicts", "errors", "seconds"; the child's {"failed", "versions"}.
    All fail when `python` is missing or the child dies; ValueError on a wrong row count."""
    if not python.exists():
        venv = python.parent.parent
        shown = venv.relative_to(ROOT) if venv.is_relative_to(ROOT) else venv
        failed = f"no peers' environment at {shown} (--prepare)"
        return {"failed": dict.fromkeys(wanted, failed), "versions": {}}
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS), "TOKENIZERS_PARALLELISM": "false"}
    command = [str(python), "-m", "harness.peer_child", json.dumps(wanted)]
    stdin = "".join(json.dumps({k: row[k] for k in SENT}) + "\n" for row in rows)
    result = subprocess.run(command, input=stdin, capture_output=True, text=True, env=env, cwd=work)
    out = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not out:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        failed = f"the peers' child exited {result.returncode}: {last}"
        return {"failed": dict.fromkeys(wanted, failed), "versions": {}}
    for row, item in zip(rows, out[1:], strict=True):  # the child answers each row in turn
        for key in ("verdicts", "errors", "seconds"):
            row.setdefault(key, {}).update(item[key])
    return out[0]


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
    print(json.dumps({"failed": failed, "versions": versions}), flush=True)
    for line in sys.stdin:
        row = json.loads(line)
        if row["set"] == "gsm8k":
            row["gold"] = row["gold"].replace(",", "")
        print(json.dumps({"id": row["id"], **score_row(peers, wanted, row)}), flush=True)


if __name__ == "__main__":
    main()
