"""Answer checkers against human labels: does oncurve's `correct` reward judge more completions
right than the checkers other trainers and harnesses pay their policies with? (issue 51)

The corpus, `data/answer_corpus.jsonl`, holds completions written by hand in the styles instruct
models answer in (`The answer is 18.`, `**Answer:** $18`, `\\boxed{}`, `#### 18`, `<answer>`
tags, the Llama-3 and Minerva final-answer sentences, units, dollars, percents, separators,
intervals, tuples, matrices, multiple-choice letters, hedges, restated questions, decimal
approximations of exact golds) for real GSM8K and MATH problems with their real golds, each
labelled by hand: true when a careful human grader marks the final answer correct (stated,
equal to the gold, simplified).

What it measures, per set and checker: agreement with the labels; true positives (right rows
paid), false positives (wrong rows paid: what a policy learns to exploit) and false negatives
(right rows unpaid: signal lost). Checkers:

- oncurve `correct`, strict and lenient (`reward.answer_match`): the reward functions of
  `oncurve.rewards.registry` called on one row, i.e. `answers_match(extract_answer(completion),
  usable_gold(gold), prompt=prompt, strict=...)`, from this checkout's `src`;
- the peers, from their own published packages, run by a child process in a separate virtual
  environment, `benchmarks/.venv-peers` (gitignored; `--prepare` makes it): math-verify's
  `parse` + `verify` (lm-eval minerva_math's `math_verify` metric), verl's `math_verify` reward,
  verl's `math_reward` (Hendrycks `is_equiv` on the last box), verl's `prime_math`, verl's
  `math_dapo`, TRL's `accuracy_reward`, and on GSM8K verl's `gsm8k` and lm-eval's gsm8k
  `strict-match` and `flexible-extract` filters with its `exact_match` metric, as the installed
  task yaml configures them. No peer package is a dependency of oncurve, and none of their code
  is in this repository: the child imports it from the peers' environment.

How each peer is called (the runner is written to `.cache/answer_checkers/peer_runner.py`):
verl's package `__init__` imports torch and Ray, so the child registers `verl`, `verl.utils`,
`verl.utils.reward_score` as bare packages over the installed folders (and `verl.utils.metric`,
a torch-only module that prime_math's timeout helper imports for a type, as a stub) and imports
the reward modules themselves. verl's `math_verify.compute_score` runs its check in a spawned
process pool, whose workers would import verl's `__init__`; the child calls the function that
pool runs (`_verify_in_subprocess`) with compute_score's own gold, `\\boxed{gold}`. TRL's
`accuracy_reward` gets the gold as the last line of a MATH solution, `\\boxed{gold}` (a gold it
cannot parse returns None: counted unpaid, and in the skipped column). math-verify gets
`parse(\\boxed{gold})` against `parse(completion)`, as lm-eval passes the solution. lm-eval's
reference is `#### gold` (its `doc_to_target` is GSM8K's answer text, whose `#### ` its
`regexes_to_ignore` strip). GSM8K golds reach every peer without thousands separators, as
verl's GSM8K preprocessing writes them (`.replace(",", "")`); oncurve gets them as GSM8K writes
them. A peer that cannot be installed or imported is listed as not run, with the reason.

    .venv/bin/python benchmarks/answer_checkers.py --prepare   # once: the peers' environment
    .venv/bin/python benchmarks/answer_checkers.py             # score, print, write results/

Writes `results/answer_checkers.md` (the tables, and the rows where oncurve strict disagrees
with the label) and `results/answer_checkers.jsonl` (every row's verdicts).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.checkout import BENCHMARKS, CACHE, RESULTS, ROOT, commit
from harness.tables import publish

CORPUS = BENCHMARKS / "data" / "answer_corpus.jsonl"
RESULTS_JSONL = RESULTS / "answer_checkers.jsonl"
PEERS_VENV = BENCHMARKS / ".venv-peers"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
RUNNER = CACHE / "answer_checkers" / "peer_runner.py"
SETS = (("gsm8k", "GSM8K"), ("math", "MATH"))

# What `--prepare` installs: math-verify with the ANTLR runtime its LaTeX parser needs, and what
# the peers' checker modules import; the peers' own packages without their dependencies (torch,
# transformers, Ray, datasets...), which the checker modules do not need.
PEER_REQUIREMENTS = [
    "math-verify",
    # the runtime of math-verify's LaTeX parser (math-verify 0.9 has no `antlr4_13_2` extra;
    # latex2sympy2_extended's `antlr4-13-2` extra pins this)
    "antlr4-python3-runtime==4.13.2",
    "pylatexenc",  # verl prime_math
    "packaging",  # trl.import_utils
    "numpy",  # verl py_functional, lm-eval metrics
    "typing_extensions",
    "sacrebleu",  # imported at the top of lm_eval.api.metrics
    "pyyaml",  # to read lm-eval's gsm8k task yaml
]
PEER_PACKAGES_NO_DEPS = ["trl", "verl", "lm_eval"]

# (key, label, sets it runs on); the oncurve checkers first, then the peers in the runner.
ONCURVE_CHECKERS = [
    ("oncurve_strict", "oncurve `correct` (strict, the default)"),
    ("oncurve_lenient", "oncurve `correct` (lenient)"),
]
PEER_CHECKERS = [
    ("math_verify", "math-verify `parse`+`verify` (lm-eval minerva_math `math_verify`)", None),
    ("verl_math_verify", "verl `math_verify`", None),
    ("verl_math_reward", "verl `math_reward` (Hendrycks `is_equiv`)", None),
    ("verl_prime_math", "verl `prime_math`", None),
    ("verl_math_dapo", "verl `math_dapo`", None),
    ("trl_accuracy", "TRL `accuracy_reward`", None),
    ("verl_gsm8k", "verl `gsm8k` (strict `####`)", "gsm8k"),
    ("lm_eval_gsm8k_strict", "lm-eval gsm8k `strict-match`", "gsm8k"),
    ("lm_eval_gsm8k_flexible", "lm-eval gsm8k `flexible-extract`", "gsm8k"),
]

# The child that scores rows with the peers. It reads {"id", "set", "gold", "prompt",
# "completion"} JSON lines on stdin and writes one JSON line per row: {"id", "verdicts",
# "errors"}; its first line says which peers loaded ({"loaded", "failed", "versions"}).
RUNNER_SOURCE = r'''
"""Scores rows with the peers' answer checkers, imported from the installed packages
(written by benchmarks/answer_checkers.py; runs in benchmarks/.venv-peers)."""
import importlib.metadata
import importlib.util
import json
import sys
import time
import types


def bare_package(name):
    """Register `name` as a package over its installed folder without running its __init__."""
    spec = importlib.util.find_spec(name)
    module = types.ModuleType(name)
    module.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = module


loaded, failed, peers = [], {}, {}


def load(key, make):
    try:
        peers[key] = make()
        loaded.append(key)
    except Exception as e:  # a peer that cannot be imported is reported, the others run
        failed[key] = f"{type(e).__name__}: {e}"


def verl_modules():
    if "verl" not in sys.modules:
        for name in ("verl", "verl.utils", "verl.utils.reward_score"):
            bare_package(name)
        metric = types.ModuleType("verl.utils.metric")  # torch-only; py_functional wants a type
        metric.Metric = type("Metric", (), {})
        sys.modules["verl.utils.metric"] = metric
    import verl.utils.reward_score as reward_score

    return reward_score


def make_math_verify():
    from math_verify import parse, verify

    return lambda row: bool(verify(gold=parse("\\boxed{" + row["gold"] + "}"), target=parse(row["completion"])))


def make_verl_math_verify():
    verl_modules()
    from verl.utils.reward_score import math_verify

    return lambda row: math_verify._verify_in_subprocess("\\boxed{" + row["gold"] + "}", row["completion"]) == 1.0


def make_verl_math_reward():
    verl_modules()
    from verl.utils.reward_score import math_reward

    return lambda row: math_reward.compute_score(row["completion"], row["gold"]) == 1.0


def make_verl_prime_math():
    verl_modules()
    from verl.utils.reward_score import prime_math

    return lambda row: bool(prime_math.compute_score(row["completion"], row["gold"])[0])


def make_verl_math_dapo():
    verl_modules()
    from verl.utils.reward_score import math_dapo

    return lambda row: bool(math_dapo.compute_score(row["completion"], row["gold"])["acc"])


def make_verl_gsm8k():
    verl_modules()
    from verl.utils.reward_score import gsm8k

    return lambda row: gsm8k.compute_score(row["completion"], row["gold"]) == 1.0


def make_trl_accuracy():
    from trl.rewards import accuracy_reward

    def check(row):
        reward = accuracy_reward([[{"role": "assistant", "content": row["completion"]}]], ["\\boxed{" + row["gold"] + "}"])[0]
        return None if reward is None else reward == 1.0

    return check


def make_lm_eval_gsm8k(filter_name):
    import os

    import yaml
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter
    from lm_eval.filters.selection import TakeFirstFilter

    spec = importlib.util.find_spec("lm_eval")
    path = os.path.join(spec.submodule_search_locations[0], "tasks", "gsm8k", "gsm8k.yaml")
    with open(path) as f:
        task = yaml.safe_load(f)
    (metric,) = [m for m in task["metric_list"] if m["metric"] == "exact_match"]
    kwargs = {k: v for k, v in metric.items() if k not in ("metric", "aggregation", "higher_is_better")}
    (chosen,) = [f for f in task["filter_list"] if f["name"] == filter_name]
    steps = []
    for step in chosen["filter"]:
        if step["function"] == "regex":
            args = {k: v for k, v in step.items() if k != "function"}
            steps.append(RegexFilter(**args))
        elif step["function"] == "take_first":
            steps.append(TakeFirstFilter())
        else:
            raise ValueError(f"unexpected filter {step['function']!r} in {path}")

    def check(row):
        responses = [[row["completion"]]]
        for step in steps:
            responses = list(step.apply(responses, [None]))
        prediction = responses[0] if isinstance(responses[0], str) else responses[0][0]
        score = exact_match_hf_evaluate(predictions=[prediction], references=["#### " + row["gold"]], **kwargs)
        return score["exact_match"] == 1.0

    return check


makers = {
    "math_verify": make_math_verify,
    "verl_math_verify": make_verl_math_verify,
    "verl_math_reward": make_verl_math_reward,
    "verl_prime_math": make_verl_prime_math,
    "verl_math_dapo": make_verl_math_dapo,
    "trl_accuracy": make_trl_accuracy,
    "verl_gsm8k": make_verl_gsm8k,
    "lm_eval_gsm8k_strict": lambda: make_lm_eval_gsm8k("strict-match"),
    "lm_eval_gsm8k_flexible": lambda: make_lm_eval_gsm8k("flexible-extract"),
}
only = json.loads(sys.argv[1])  # {key: set or null}
for key in only:
    load(key, makers[key])
versions = {}
for dist in ("math-verify", "latex2sympy2_extended", "trl", "verl", "lm_eval", "sympy"):
    try:
        versions[dist] = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        versions[dist] = None
print(json.dumps({"loaded": loaded, "failed": failed, "versions": versions}), flush=True)
for line in sys.stdin:
    row = json.loads(line)
    verdicts, errors, seconds = {}, {}, {}
    for key in loaded:
        if only[key] is not None and only[key] != row["set"]:
            continue
        start = time.perf_counter()
        try:
            verdict = peers[key](row)
            verdicts[key] = None if verdict is None else bool(verdict)
        except Exception as e:
            verdicts[key] = None
            errors[key] = f"{type(e).__name__}: {e}"[:200]
        seconds[key] = time.perf_counter() - start
    print(json.dumps({"id": row["id"], "verdicts": verdicts, "errors": errors, "seconds": seconds}), flush=True)
'''


def read_corpus(path: Path = CORPUS) -> list[dict[str, Any]]:
    """The labelled rows; raises ValueError on a row missing a field or with an unknown set."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        missing = {"id", "set", "gold", "prompt", "completion", "label", "note"} - set(row)
        if missing or row["set"] not in dict(SETS) or not isinstance(row["label"], bool):
            raise ValueError(f"{path}: bad row {row.get('id')!r} (missing {sorted(missing)})")
    if len({row["id"] for row in rows}) != len(rows):
        raise ValueError(f"{path}: duplicate ids")
    return rows


def prepare() -> None:
    """Create `benchmarks/.venv-peers` and install the peers' checkers into it from PyPI."""
    if not PEERS_PYTHON.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    pip = [str(PEERS_PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *PEER_REQUIREMENTS], check=True)
    for package in PEER_PACKAGES_NO_DEPS:  # each alone: one that fails leaves the others
        result = subprocess.run([*pip, "--no-deps", package])
        if result.returncode != 0:
            print(f"could not install {package} (exit {result.returncode}); it will be reported")
    freeze = subprocess.run(
        [str(PEERS_PYTHON), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    print(f"peers' environment ready: {PEERS_VENV}")
    print(freeze)


def score_oncurve(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{row id: {"verdicts": {checker: bool | None}, "extracted": str | None, "seconds": ...}}
    from oncurve's `correct` reward in both matchings, called as the trainer calls it: one row,
    the `answer` column holding the gold. None where the reward leaves the row unscored or
    math-verify timed out (the runner counts a timeout as unscored)."""
    from oncurve.rewards.extraction import extract_answer
    from oncurve.rewards.registry import answer_match_reward, lenient_answer_match_reward

    functions = {
        "oncurve_strict": answer_match_reward,
        "oncurve_lenient": lenient_answer_match_reward,
    }
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        verdicts: dict[str, bool | None] = {}
        seconds: dict[str, float] = {}
        for key, fn in functions.items():
            start = time.perf_counter()
            try:
                (score,) = fn([row["prompt"]], [row["completion"]], answer=[row["gold"]])
                verdicts[key] = None if score is None else score == 1.0
            except TimeoutError:
                verdicts[key] = None
            seconds[key] = time.perf_counter() - start
        out[row["id"]] = {
            "verdicts": verdicts,
            "extracted": extract_answer(row["completion"]),
            "seconds": seconds,
        }
    return out


def score_peers(rows: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """(per row {"verdicts", "errors", "seconds"}, header {"loaded", "failed", "versions"}) from
    the runner child in the peers' environment; every peer failed when the environment is
    missing (run --prepare)."""
    if not PEERS_PYTHON.exists():
        reason = f"no peers' environment at {PEERS_VENV.relative_to(ROOT)} (run --prepare)"
        return {}, {"loaded": [], "failed": dict.fromkeys(_peer_keys(), reason), "versions": {}}
    RUNNER.parent.mkdir(parents=True, exist_ok=True)
    RUNNER.write_text(RUNNER_SOURCE.lstrip())
    wanted = {key: only for key, _, only in PEER_CHECKERS}
    # GSM8K golds as verl's GSM8K preprocessing writes them: no thousands separators
    stdin = "".join(
        json.dumps(
            {
                "id": row["id"],
                "set": row["set"],
                "gold": row["gold"].replace(",", "") if row["set"] == "gsm8k" else row["gold"],
                "prompt": row["prompt"],
                "completion": row["completion"],
            }
        )
        + "\n"
        for row in rows
    )
    env = {**os.environ, "PYTHONPATH": "", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [str(PEERS_PYTHON), str(RUNNER), json.dumps(wanted)],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=RUNNER.parent,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        reason = f"the peers' runner exited {result.returncode}: {last}"
        return {}, {"loaded": [], "failed": dict.fromkeys(_peer_keys(), reason), "versions": {}}
    header = json.loads(lines[0])
    scored = {}
    for line in lines[1:]:
        item = json.loads(line)
        scored[item.pop("id")] = item
    if len(scored) != len(rows):
        raise RuntimeError(f"the peers' runner scored {len(scored)} of {len(rows)} rows")
    return scored, header


def _peer_keys() -> list[str]:
    return [key for key, _, _ in PEER_CHECKERS]


def confusion(
    rows: list[dict[str, Any]], verdicts: dict[str, dict[str, bool | None]], key: str
) -> dict[str, int]:
    """Counts of one checker against the labels: tp (right rows paid), fp (wrong rows paid),
    fn (right rows unpaid), tn, skipped (no verdict: unscored, an error, a timeout; unpaid)."""
    counts = dict.fromkeys(("tp", "fp", "fn", "tn", "skipped"), 0)
    for row in rows:
        verdict = verdicts[row["id"]].get(key)
        if verdict is None:
            counts["skipped"] += 1
        paid = bool(verdict)
        counts[
            {(True, True): "tp", (False, True): "fp", (True, False): "fn"}.get(
                (row["label"], paid), "tn"
            )
        ] += 1
    return counts


def set_table(
    rows: list[dict[str, Any]],
    verdicts: dict[str, dict[str, bool | None]],
    seconds: dict[str, list[float]],
    checkers: list[tuple[str, str]],
    failed: dict[str, str],
) -> str:
    """The markdown table of one set: a line per checker, best agreement first."""
    from harness.tables import markdown_table

    right = sum(row["label"] for row in rows)
    lines = []
    for key, label in checkers:
        if key in failed:
            reason = " ".join(failed[key].split())[:160].replace("|", "\\|")
            lines.append((-1.0, [label, "not run", "", "", "", "", "", reason]))
            continue
        c = confusion(rows, verdicts, key)
        agreement = (c["tp"] + c["tn"]) / len(rows)
        times = seconds.get(key) or [0.0]
        lines.append(
            (
                agreement,
                [
                    label,
                    f"{100 * agreement:.1f}% ({c['tp'] + c['tn']}/{len(rows)})",
                    f"{c['tp']}/{right}",
                    f"{c['fp']}/{len(rows) - right}",
                    str(c["fn"]),
                    str(c["tn"]),
                    str(c["skipped"]),
                    f"{1000 * sum(times) / len(times):.1f}",
                ],
            )
        )
    lines.sort(key=lambda item: -item[0])
    header = [
        "checker",
        "agreement",
        "TP: right rows paid",
        "FP: wrong rows paid",
        "FN: right rows unpaid",
        "TN",
        "no verdict",
        "ms/row",
    ]
    return markdown_table(header, [line for _, line in lines])


def _cell(text: Any, limit: int = 60) -> str:
    """`text` as a table cell: one line, `|` escaped, at most `limit` characters."""
    if text is None:
        return "(none)"
    text = " ".join(str(text).split()).replace("|", "\\|")
    return "`" + (text if len(text) <= limit else text[: limit - 1] + "…").replace("`", "'") + "`"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", action="store_true", help="make the peers' environment")
    args = parser.parse_args()
    if args.prepare:
        prepare()
        return

    rows = read_corpus()
    start = time.perf_counter()
    ours = score_oncurve(rows)
    peers, header = score_peers(rows)
    wall = time.perf_counter() - start

    verdicts: dict[str, dict[str, bool | None]] = {}
    for row in rows:
        verdicts[row["id"]] = {**ours[row["id"]]["verdicts"]}
        verdicts[row["id"]].update(peers.get(row["id"], {}).get("verdicts", {}))
    failed = dict(header["failed"])

    sections = []
    versions = ", ".join(f"{k} {v}" for k, v in header["versions"].items() if v)
    oncurve_rev = f"commit {commit()}"
    sections.append(
        f"Run {datetime.date.today().isoformat()}: `.venv/bin/python benchmarks/answer_checkers.py`"
        f" on {platform.node() or 'this machine'} (Python {platform.python_version()}), "
        f"{wall:.0f} s for all rows; oncurve from {oncurve_rev}. Corpus: `benchmarks/data/answer_corpus.jsonl`, {len(rows)} "
        f"hand-written completions of real GSM8K and MATH problems with their golds, each "
        f"labelled by hand. Peers' versions (`benchmarks/.venv-peers`): {versions or 'none'}.\n\n"
        "TP: right rows paid; FP: wrong rows paid (the rows a policy learns to exploit); FN: "
        "right rows unpaid; TN: wrong rows unpaid; no verdict: unscored, an error or a timeout "
        "(unpaid, counted in FN or TN). ms/row: mean milliseconds per row of the call (verl "
        "`prime_math` forks a process per comparison). GSM8K-only checkers are not run on MATH."
    )
    for set_name, title in SETS:
        subset = [row for row in rows if row["set"] == set_name]
        checkers = [(k, label) for k, label in ONCURVE_CHECKERS]
        checkers += [(k, label) for k, label, only in PEER_CHECKERS if only in (None, set_name)]
        seconds: dict[str, list[float]] = {}
        for row in subset:
            for source in (ours[row["id"]], peers.get(row["id"], {})):
                for key, value in source.get("seconds", {}).items():
                    seconds.setdefault(key, []).append(value)
        right = sum(row["label"] for row in subset)
        table = set_table(subset, verdicts, seconds, checkers, failed)
        sections.append(
            f"## {title}: {len(subset)} rows, {right} right, {len(subset) - right} wrong\n\n{table}"
        )
        print(f"\n{title}: {len(subset)} rows, {right} right, {len(subset) - right} wrong\n")
        print(table)

    disagreements = [
        row for row in rows if bool(verdicts[row["id"]]["oncurve_strict"]) != row["label"]
    ]
    listing = [
        [
            row["id"],
            _cell(row["gold"], 40),
            _cell(ours[row["id"]]["extracted"], 40),
            "right" if row["label"] else "wrong",
            "paid" if verdicts[row["id"]]["oncurve_strict"] else "unpaid",
            row["note"],
        ]
        for row in disagreements
    ]
    from harness.tables import markdown_table

    body = (
        markdown_table(
            ["id", "gold", "extracted (`extract_answer`)", "label", "oncurve strict", "row tests"],
            listing,
        )
        if listing
        else "None."
    )
    sections.append(
        f"## Rows where oncurve strict disagrees with the label ({len(disagreements)})\n\n{body}"
    )
    print(f"\nRows where oncurve strict disagrees with the label ({len(disagreements)}):\n")
    print(body)
    if failed:
        not_run = "\n".join(f"- `{key}`: {reason}" for key, reason in failed.items())
        sections.append(f"## Peers not run\n\n{not_run}")
        print(f"\nPeers not run:\n{not_run}")
    errors: dict[str, int] = {}
    for item in peers.values():
        for key in item.get("errors", {}):
            errors[key] = errors.get(key, 0) + 1
    if errors:
        sections.append(
            "Errors raised by a peer on a row (scored unpaid): "
            + ", ".join(f"`{k}` {n}" for k, n in sorted(errors.items()))
            + "."
        )

    title = "Answer checkers against human labels"
    page = f"# {title}\n\n" + "\n\n".join(sections) + "\n"
    publish("answer_checkers", title, "", {"markdown": page})
    with RESULTS_JSONL.open("w") as f:
        for row in rows:
            record = {
                "id": row["id"],
                "set": row["set"],
                "gold": row["gold"],
                "label": row["label"],
                "extracted": ours[row["id"]]["extracted"],
                "verdicts": verdicts[row["id"]],
                "errors": peers.get(row["id"], {}).get("errors", {}),
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"\nwrote {RESULTS_JSONL.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
