"""Answer checkers against human labels: does oncurve's `correct` reward judge more completions
right than the checkers other trainers and harnesses pay their policies with?

The corpus, `data/answer_corpus.jsonl`: completions of real GSM8K and MATH problems with their
real golds, hand-written in the styles instruct models answer in (`The answer is 18.`,
`\\boxed{}`, `#### 18`, units, intervals, hedges...; each row's "note" names its style), each
labelled true when a careful human grader marks its final answer correct (stated, equal to the
gold, simplified). oncurve's `correct`, strict and lenient, is called from this checkout's `src`
as the trainer calls it; the peers' (`CHECKERS`) in their own environment (`harness.peer_child`).
GSM8K golds reach every peer without thousands separators, as verl's GSM8K preprocessing writes
them; a peer that cannot be installed or imported is listed as not run.

    .venv/bin/python benchmarks/answer_checkers.py --prepare   # once: the peers' environment
    .venv/bin/python benchmarks/answer_checkers.py             # score, print, write results/

Records each set's figures (`LEGEND`) in `results/answer_checkers.md` and every row's verdicts
in `results/answer_checkers.jsonl`.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from harness.checkout import BENCHMARKS, CACHE, RESULTS, ROOT
from harness.peer_child import oncurve_checks, prepare, score_in_peers, score_row, tally
from harness.records import read_jsonl, write_jsonl
from harness.tables import code_cell, markdown_table, publish

NAME = "answer_checkers"
TITLE = "Answer checkers against human labels"
CORPUS = BENCHMARKS / "data" / "answer_corpus.jsonl"
SETS = {"gsm8k": "GSM8K", "math": "MATH"}
FIELDS = {"id", "set", "gold", "prompt", "completion", "label", "note"}
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


def scored_corpus() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The labelled rows (ValueError on a row missing a field, with an unknown set or a repeated
    id), each with its "verdicts", "errors" and "seconds" by checker and what `extract_answer`
    takes from its completion ("extracted"); and the peers' child's {"failed", "versions"}.
    oncurve's checks raise any error but a timeout; the peers get GSM8K golds without commas."""
    from oncurve.rewards.extraction import extract_answer

    rows = read_jsonl(CORPUS)
    for row in rows:
        missing = FIELDS - set(row)
        if missing or row["set"] not in SETS or not isinstance(row["label"], bool):
            raise ValueError(f"{CORPUS}: bad row {row.get('id')!r} (missing {sorted(missing)})")
    if len({row["id"] for row in rows}) != len(rows):
        raise ValueError(f"{CORPUS}: duplicate ids")
    checks = {f"oncurve_{name}": check for name, check in oncurve_checks().items()}
    rows = [row | score_row(checks, dict.fromkeys(checks), row, catch=()) for row in rows]
    sent = [{k: row[k] for k in ("id", "set", "gold", "prompt", "completion")} for row in rows]
    for row in sent:
        row["gold"] = row["gold"].replace(",", "") if row["set"] == "gsm8k" else row["gold"]
    header, scored = score_in_peers(sent, PEERS, CACHE / NAME)
    for row in rows:
        row["extracted"] = extract_answer(row["completion"])
        for key, by_checker in scored.get(row["id"], {}).items():
            row[key].update(by_checker)
    return rows, header


def set_counts(name: str, rows: list[dict[str, Any]], failed: dict) -> dict[str, Any]:
    """The figures of set `name` of the scored `rows`: its rows, how many are right, and per
    checker that runs on it {"not_run": reason} when it is in `failed`, else the `tally` of its
    verdicts against the labels and its mean milliseconds per row."""
    subset = [row for row in rows if row["set"] == name]
    checkers: dict[str, dict[str, Any]] = {}
    for key in (key for key, (_, only) in CHECKERS.items() if only in (None, name)):
        if key in failed:
            checkers[key] = {"not_run": failed[key]}
        else:
            ms = 1000 * sum(row["seconds"][key] for row in subset) / max(len(subset), 1)
            counts = tally((row["verdicts"][key], row["label"]) for row in subset)
            checkers[key] = counts | {"ms_per_row": round(ms, 2)}
    return {"rows": len(subset), "right": sum(row["label"] for row in subset), "checkers": checkers}


def checker_table(rows: int, right: int, checkers: dict[str, dict[str, Any]]) -> str:
    """The markdown table of one set of `rows` labelled rows, `right` of them right, from each
    checker's counts (`set_counts`) or {"not_run": reason}: best agreement first, not run last."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", action="store_true", help="make the peers' environment")
    if parser.parse_args().prepare:
        prepare()
        return
    start = time.perf_counter()
    rows, header = scored_corpus()
    wall = time.perf_counter() - start
    sets = {name: set_counts(name, rows, header["failed"]) for name in SETS}
    disagreements = [
        {k: row[k] for k in ("id", "gold", "label", "note", "extracted")}
        for row in rows
        if bool(row["verdicts"]["oncurve_strict"]) != row["label"]
    ]
    errors = Counter(key for row in rows for key in row["errors"])
    figures = {"wall_s": round(wall, 1), "corpus_rows": len(rows), "sets": sets}
    figures |= {"disagreements": disagreements, "peer_versions": header["versions"]}
    figures |= {"not_run": header["failed"], "errors": dict(sorted(errors.items()))}
    print(publish(NAME, TITLE, "", {"renderer": NAME, **figures}).read_text())
    path, kept = RESULTS / f"{NAME}.jsonl", ("id", "set", "gold", "label", "extracted")
    write_jsonl(path, ({k: row[k] for k in (*kept, "verdicts", "errors")} for row in rows))
    print(f"wrote {path.relative_to(ROOT)}")


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
    machine = row.get("machine")
    where = f" on {machine['cpu']}, {machine['cores']} cores" if machine else ""
    text = f"Run {row['date']}: `{row['command']}`{where} (Python {row['versions']['python']}), "
    text += f"{row['wall_s']:.0f} s for all rows; oncurve from commit {row['commit']}. Corpus: "
    text += f"`benchmarks/data/answer_corpus.jsonl`, {row['corpus_rows']} hand-written "
    text += "completions of real GSM8K and MATH problems with their golds, each labelled by "
    text += f"hand. Peers' versions (`benchmarks/.venv-peers`): {versions or 'none'}.\n\n"
    parts = [f"# {TITLE}", text + LEGEND]
    for name, figures in row["sets"].items():
        n, right = figures["rows"], figures["right"]
        table = checker_table(n, right, figures["checkers"])
        parts.append(f"## {SETS[name]}: {n} rows, {right} right, {n - right} wrong\n\n{table}")
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
