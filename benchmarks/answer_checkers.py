"""Answer checkers against human labels: does oncurve's `correct` reward judge more completions
right than the checkers other trainers and harnesses pay their policies with?

The corpus, `data/answer_corpus.jsonl`: completions of real GSM8K and MATH problems with their
real golds, hand-written in the styles instruct models answer in (`The answer is 18.`,
`\\boxed{}`, `#### 18`, units, intervals, hedges...; each row's "note" names its style), each
labelled true when a careful human grader marks its final answer correct (stated, equal to the
gold, simplified). oncurve's `correct`, strict and lenient, runs from this checkout's `src` as the
trainer calls it; the peers' in their own environment (`harness.peer_child`, GSM8K golds without
thousands separators, as verl's GSM8K preprocessing writes them); a peer that cannot be
installed or imported is listed as not run.

    .venv/bin/python benchmarks/answer_checkers.py --prepare   # once: the peers' environment
    .venv/bin/python benchmarks/answer_checkers.py             # score, print, write results/
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from harness.checkout import BENCHMARKS, CACHE, RESULTS
from harness.peer_child import oncurve_checks, prepare, score_in_peers, score_row, tally
from harness.records import read_jsonl, write_jsonl
from harness.tables import code_cell, markdown_table, publish

NAME = "answer_checkers"
TITLE = "Answer checkers against human labels"
CORPUS = BENCHMARKS / "data" / "answer_corpus.jsonl"
SETS = {"gsm8k": "GSM8K", "math": "MATH"}
LEGEND = (
    "TP: right rows paid; FP: wrong rows paid (the rows a policy learns to exploit); FN: right "
    "rows unpaid; TN: wrong rows unpaid; no verdict: unscored, an error or a timeout (unpaid, "
    "counted in FN or TN). ms/row: mean milliseconds per row of the call (verl `prime_math` "
    "forks a process per comparison). GSM8K-only checkers are not run on MATH."
)
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
PEERS = {key: only for key, (_, only) in CHECKERS.items() if not key.startswith("oncurve")}


def set_counts(name: str, rows: list[dict[str, Any]], failed: dict) -> dict[str, Any]:
    """Set `name`'s figures: its rows, how many are right, and for each checker that runs on it,
    unless `failed`, the `tally` of its verdicts against the labels and its mean ms per row."""
    subset = [row for row in rows if row["set"] == name]
    checkers: dict[str, dict[str, Any]] = {}
    for key in [k for k, (_, only) in CHECKERS.items() if only in (None, name) and k not in failed]:
        ms = 1000 * sum(row["seconds"][key] for row in subset) / len(subset)
        counts = tally((row["verdicts"][key], row["label"]) for row in subset)
        checkers[key] = counts | {"ms_per_row": round(ms, 2)}
    return {"rows": len(subset), "right": sum(row["label"] for row in subset), "checkers": checkers}


def set_section(name: str, figures: dict[str, Any]) -> str:
    """Set `name`'s section from its figures (`set_counts`): a row per checker, best first."""
    rows, right, lines = figures["rows"], figures["right"], []
    for key, c in sorted(figures["checkers"].items(), key=lambda kc: -kc[1]["tp"] - kc[1]["tn"]):
        agree = c["tp"] + c["tn"]
        cells = [f"{100 * agree / rows:.1f}% ({agree}/{rows})", f"{c['tp']}/{right}"]
        cells += [f"{c['fp']}/{rows - right}", *(str(c[k]) for k in ("fn", "tn", "skipped"))]
        lines.append([CHECKERS[key][0], *cells, f"{c['ms_per_row']:.1f}"])
    header = ["checker", "agreement", "TP: right rows paid", "FP: wrong rows paid"]
    header += ["FN: right rows unpaid", "TN", "no verdict", "ms/row"]
    table = markdown_table(header, lines)
    return f"## {SETS[name]}: {rows} rows, {right} right, {rows - right} wrong\n\n{table}"


def main() -> None:
    from oncurve.rewards.extraction import extract_answer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", action="store_true", help="make the peers' environment")
    if parser.parse_args().prepare:
        return prepare()
    start = time.perf_counter()
    checks = {f"oncurve_{name}": check for name, check in oncurve_checks().items()}
    only = dict.fromkeys(checks)  # oncurve's checks raise any error but a timeout
    rows = [row | score_row(checks, only, row, catch=()) for row in read_jsonl(CORPUS)]
    header = score_in_peers(rows, PEERS, CACHE / NAME)
    wall = time.perf_counter() - start
    sets = {name: set_counts(name, rows, header["failed"]) for name in SETS}
    for row in rows:
        row["extracted"] = extract_answer(row["completion"])
    wrong = [row for row in rows if bool(row["verdicts"]["oncurve_strict"]) != row["label"]]
    kept = ("id", "gold", "label", "note", "extracted")
    disagreements = [{k: row[k] for k in kept} for row in wrong]
    errors = Counter(key for row in rows for key in row["errors"])
    figures = {"wall_s": round(wall, 1), "corpus_rows": len(rows), "sets": sets}
    figures |= {"disagreements": disagreements, "peer_versions": header["versions"]}
    figures |= {"not_run": header["failed"], "errors": dict(sorted(errors.items()))}
    print(publish(NAME, TITLE, "", {"renderer": NAME, **figures}).read_text())
    kept = ("id", "set", "gold", "label", "extracted", "verdicts", "errors")  # every row's verdicts
    write_jsonl(RESULTS / f"{NAME}.jsonl", ({k: row[k] for k in kept} for row in rows))


def summary(row: dict[str, Any]) -> str:
    """The row in one line: oncurve strict's agreement with the labels and its wrong rows
    paid, by set."""
    parts = []
    for name, figures in row["sets"].items():
        c, n = figures["checkers"]["oncurve_strict"], figures["rows"]
        parts.append(f"{SETS[name]} {c['tp'] + c['tn']}/{n} agree, {c['fp']} wrong rows paid")
    return "oncurve `correct` (strict) against hand labels: " + "; ".join(parts)


def section(row: dict[str, Any]) -> str:
    """results/answer_checkers.md from a row: a table per set, the rows strict gets wrong."""
    versions = ", ".join(f"{k} {v}" for k, v in row["peer_versions"].items() if v)
    machine, python = row["machine"], row["versions"]["python"]
    text = f"Run {row['date']}: `{row['command']}` on {machine['cpu']}, {machine['cores']} cores "
    text += f"(Python {python}), {row['wall_s']:.0f} s for all rows; oncurve from commit "
    text += f"{row['commit']}. Corpus: `benchmarks/data/answer_corpus.jsonl`, {row['corpus_rows']} "
    text += "hand-written completions of real GSM8K and MATH problems with their golds, each "
    text += "labelled by hand. Peers' versions (`benchmarks/.venv-peers`): "
    parts = [f"# {TITLE}", f"{text}{versions or 'none'}.\n\n{LEGEND}"]
    parts += [set_section(name, figures) for name, figures in row["sets"].items()]
    listing = [
        [d["id"], code_cell(d["gold"], 40), code_cell(d["extracted"], 40)]
        + [("wrong", "right")[d["label"]], ("paid", "unpaid")[d["label"]], d["note"]]
        for d in row["disagreements"]
    ]
    header = ["id", "gold", "extracted (`extract_answer`)", "label", "oncurve strict"]
    body = markdown_table([*header, "row tests"], listing) if listing else "None."
    title = f"Rows where oncurve strict disagrees with the label ({len(listing)})"
    parts.append(f"## {title}\n\n{body}")
    if row["not_run"]:
        lines = "\n".join(f"- `{key}`: {why}" for key, why in row["not_run"].items())
        parts.append(f"## Peers not run\n\n{lines}")
    if row["errors"]:
        counts = ", ".join(f"`{k}` {n}" for k, n in row["errors"].items())
        parts.append(f"Errors raised by a peer on a row (scored unpaid): {counts}.")
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    main()
