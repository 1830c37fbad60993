"""Peers' answer checkers, from their own published packages, against labelled completions:
their environment, their verdicts, and the table of each checker's counts.

The peers run in a child (`harness.peer_child`) in a separate virtual environment,
`benchmarks/.venv-peers` (gitignored; `prepare` makes it from PyPI): math-verify's `parse` +
`verify` (lm-eval minerva_math's `math_verify` metric), verl's `math_verify` reward, verl's
`math_reward` (Hendrycks `is_equiv` on the last box), verl's `prime_math`, verl's `math_dapo`,
TRL's `accuracy_reward`, and on GSM8K verl's `gsm8k` and lm-eval's gsm8k `strict-match` and
`flexible-extract` filters with its `exact_match` metric, as the installed task yaml configures
them. No peer package is a dependency of oncurve, and none of their code is in this repository.

How each is called: verl's package `__init__` imports torch and Ray, so the child registers
`verl`, `verl.utils`, `verl.utils.reward_score` as bare packages over the installed folders
(and stubs `verl.utils.metric`) and imports the reward modules themselves; verl's
`math_verify.compute_score` runs its check in a spawned process pool, so the child calls the
function that pool runs with compute_score's own gold, `\\boxed{gold}`. TRL's `accuracy_reward`
gets the gold as the last line of a MATH solution, `\\boxed{gold}` (a gold it cannot parse
returns None: unpaid, and no verdict). math-verify gets `parse(\\boxed{gold})` against
`parse(completion)`, as lm-eval passes the solution. lm-eval's reference is `#### gold` (its
`doc_to_target` is GSM8K's answer text, whose `#### ` its `regexes_to_ignore` strip). GSM8K
golds reach every peer without thousands separators, as verl's GSM8K preprocessing writes them
(`.replace(",", "")`). A peer that cannot be installed or imported is reported as not run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from harness.checkout import BENCHMARKS, CACHE, ROOT
from harness.tables import markdown_table

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

# Every checker: key -> (label, the one set it runs on or None for all); oncurve's first.
CHECKERS: dict[str, tuple[str, str | None]] = {
    "oncurve_strict": ("oncurve `correct` (strict, the default)", None),
    "oncurve_lenient": ("oncurve `correct` (lenient)", None),
    "math_verify": ("math-verify `parse`+`verify` (lm-eval minerva_math `math_verify`)", None),
    "verl_math_verify": ("verl `math_verify`", None),
    "verl_math_reward": ("verl `math_reward` (Hendrycks `is_equiv`)", None),
    "verl_prime_math": ("verl `prime_math`", None),
    "verl_math_dapo": ("verl `math_dapo`", None),
    "trl_accuracy": ("TRL `accuracy_reward`", None),
    "verl_gsm8k": ("verl `gsm8k` (strict `####`)", "gsm8k"),
    "lm_eval_gsm8k_strict": ("lm-eval gsm8k `strict-match`", "gsm8k"),
    "lm_eval_gsm8k_flexible": ("lm-eval gsm8k `flexible-extract`", "gsm8k"),
}
PEERS = [key for key in CHECKERS if not key.startswith("oncurve")]


def prepare() -> None:
    """Create `benchmarks/.venv-peers` and install the peers' checkers into it from PyPI."""
    if not PEERS_PYTHON.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    pip = [str(PEERS_PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *PEER_REQUIREMENTS], check=True)
    for package in PEER_PACKAGES_NO_DEPS:  # each alone: one that fails leaves the others
        if subprocess.run([*pip, "--no-deps", package]).returncode:
            print(f"could not install {package}; it will be reported as not run")
    freeze = [str(PEERS_PYTHON), "-m", "pip", "list", "--format=freeze"]
    print(f"peers' environment ready: {PEERS_VENV}")
    print(subprocess.run(freeze, capture_output=True, text=True, check=True).stdout)


def score_peers(rows: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """(per row id {"verdicts", "errors", "seconds"}, {"loaded", "failed", "versions"}) from the
    peers' child; every peer failed, with the reason, when the environment is missing or the
    child dies. GSM8K golds go without thousands separators."""

    def all_failed(reason: str) -> tuple[dict, dict[str, Any]]:
        return {}, {"loaded": [], "failed": dict.fromkeys(PEERS, reason), "versions": {}}

    if not PEERS_PYTHON.exists():
        return all_failed(f"no peers' environment at {PEERS_VENV.relative_to(ROOT)} (--prepare)")
    fields = ("id", "set", "gold", "prompt", "completion")
    lines = []
    for row in rows:
        sent = {field: row[field] for field in fields}
        if row["set"] == "gsm8k":
            sent["gold"] = row["gold"].replace(",", "")
        lines.append(json.dumps(sent) + "\n")
    wanted = {key: CHECKERS[key][1] for key in PEERS}
    work = CACHE / "answer_checkers"  # the child's cwd, for whatever a peer writes there
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS), "TOKENIZERS_PARALLELISM": "false"}
    command = [str(PEERS_PYTHON), "-m", "harness.peer_child", json.dumps(wanted)]
    result = subprocess.run(
        command, input="".join(lines), capture_output=True, text=True, env=env, cwd=work
    )
    out = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not out:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return all_failed(f"the peers' child exited {result.returncode}: {last}")
    scored = {item.pop("id"): item for item in map(json.loads, out[1:])}
    if len(scored) != len(rows):
        raise RuntimeError(f"the peers' child scored {len(scored)} of {len(rows)} rows")
    return scored, json.loads(out[0])


def confusion(
    labels: list[bool], verdicts: list[bool | None], seconds: list[float]
) -> dict[str, Any]:
    """One checker's counts against the labels: tp (right rows paid), fp (wrong rows paid), fn
    (right rows unpaid), tn, skipped (no verdict: unscored, an error, a timeout; unpaid), and
    its mean milliseconds per row."""
    counts: dict[str, Any] = dict.fromkeys(("tp", "fp", "fn", "tn", "skipped"), 0)
    for label, verdict in zip(labels, verdicts, strict=True):
        paid = bool(verdict)
        counts["skipped"] += verdict is None
        counts[("t" if paid == label else "f") + ("p" if paid else "n")] += 1
    counts["ms_per_row"] = round(1000 * sum(seconds) / max(len(seconds), 1), 2)
    return counts


def set_counts(
    name: str, rows: list[dict[str, Any]], scored: dict[str, dict[str, Any]], failed: dict
) -> dict[str, Any]:
    """The figures of set `name` of the labelled `rows`: its rows, how many are right, and each
    checker that runs on it: its counts (`confusion`) from `scored` ({row id: {"verdicts",
    "seconds"}}), or {"not_run": reason} when it is in `failed`."""
    subset = [row for row in rows if row["set"] == name]
    checkers: dict[str, dict[str, Any]] = {}
    for key, (_, only) in CHECKERS.items():
        if only not in (None, name):
            continue
        if key in failed:
            checkers[key] = {"not_run": failed[key]}
            continue
        verdicts = [scored[row["id"]]["verdicts"][key] for row in subset]
        seconds = [scored[row["id"]]["seconds"][key] for row in subset]
        checkers[key] = confusion([row["label"] for row in subset], verdicts, seconds)
    right = sum(row["label"] for row in subset)
    return {"rows": len(subset), "right": right, "checkers": checkers}


def checker_table(rows: int, right: int, checkers: dict[str, dict[str, Any]]) -> str:
    """The markdown table of one set of `rows` labelled rows, `right` of them right, from each
    checker's counts (`confusion`) or {"not_run": reason}: best agreement first, not run last."""
    lines = []
    for key, c in checkers.items():
        label = CHECKERS[key][0]
        if "not_run" in c:
            reason = " ".join(c["not_run"].split())[:160].replace("|", "\\|")
            lines.append((-1.0, [label, "not run", "", "", "", "", "", reason]))
            continue
        agree = c["tp"] + c["tn"]
        cells = [f"{100 * agree / rows:.1f}% ({agree}/{rows})", f"{c['tp']}/{right}"]
        cells += [f"{c['fp']}/{rows - right}", *(str(c[k]) for k in ("fn", "tn", "skipped"))]
        lines.append((agree / rows, [label, *cells, f"{c['ms_per_row']:.1f}"]))
    lines.sort(key=lambda item: -item[0])
    header = ["checker", "agreement", "TP: right rows paid", "FP: wrong rows paid"]
    header += ["FN: right rows unpaid", "TN", "no verdict", "ms/row"]
    return markdown_table(header, [line for _, line in lines])
