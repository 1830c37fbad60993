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
(right rows unpaid: signal lost). Checkers: oncurve's `correct`, strict and lenient
(`reward.answer_match`), the reward functions of `oncurve.rewards.registry` called on one row
with the gold as GSM8K and MATH write it, from this checkout's `src`; and the peers'
(math-verify, verl, TRL, lm-eval) from their own packages in `benchmarks/.venv-peers`, called
as `harness.answer_peers` describes. A peer that cannot be installed or imported is listed as
not run, with the reason.

    .venv/bin/python benchmarks/answer_checkers.py --prepare   # once: the peers' environment
    .venv/bin/python benchmarks/answer_checkers.py             # score, print, write results/

Records the counts (`results/answer_checkers.md`) and writes every row's verdicts to
`results/answer_checkers.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from typing import Any

from harness.answer_peers import checker_table, prepare, score_peers, set_counts
from harness.checkout import BENCHMARKS, RESULTS, ROOT
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


def read_corpus() -> list[dict[str, Any]]:
    """The labelled rows; raises ValueError on a row missing a field or with an unknown set."""
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    for row in rows:
        missing = FIELDS - set(row)
        if missing or row["set"] not in SETS or not isinstance(row["label"], bool):
            raise ValueError(f"{CORPUS}: bad row {row.get('id')!r} (missing {sorted(missing)})")
    if len({row["id"] for row in rows}) != len(rows):
        raise ValueError(f"{CORPUS}: duplicate ids")
    return rows


def score_oncurve(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{row id: {"verdicts", "extracted", "seconds"}} from oncurve's `correct` reward, strict and
    lenient, called as the trainer calls it: one row, the `answer` column holding the gold. No
    verdict (None) where the reward leaves the row unscored or its comparison timed out."""
    from oncurve.rewards.extraction import extract_answer
    from oncurve.rewards.registry import answer_match_reward, lenient_answer_match_reward

    functions = {
        "oncurve_strict": answer_match_reward,
        "oncurve_lenient": lenient_answer_match_reward,
    }
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        item: dict[str, Any] = {"verdicts": {}, "seconds": {}}
        for key, fn in functions.items():
            start = time.perf_counter()
            try:
                (score,) = fn([row["prompt"]], [row["completion"]], answer=[row["gold"]])
                item["verdicts"][key] = None if score is None else score == 1.0
            except TimeoutError:
                item["verdicts"][key] = None
            item["seconds"][key] = time.perf_counter() - start
        out[row["id"]] = {**item, "extracted": extract_answer(row["completion"])}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", action="store_true", help="make the peers' environment")
    if parser.parse_args().prepare:
        prepare()
        return
    rows = read_corpus()
    start = time.perf_counter()
    scored = score_oncurve(rows)
    peers, header = score_peers(rows)
    wall = time.perf_counter() - start
    for row in rows:
        for key in ("verdicts", "errors", "seconds"):
            scored[row["id"]].setdefault(key, {}).update(peers.get(row["id"], {}).get(key, {}))
    sets = {name: set_counts(name, rows, scored, header["failed"]) for name in SETS}
    disagreements = [
        {**{k: row[k] for k in ("id", "gold", "label", "note")}, "extracted": item["extracted"]}
        for row in rows
        if bool((item := scored[row["id"]])["verdicts"]["oncurve_strict"]) != row["label"]
    ]
    errors = Counter(key for item in scored.values() for key in item["errors"])
    figures = {"wall_s": round(wall, 1), "corpus_rows": len(rows), "sets": sets}
    figures |= {"disagreements": disagreements, "peer_versions": header["versions"]}
    figures |= {"not_run": header["failed"], "errors": dict(sorted(errors.items()))}
    print(publish(NAME, TITLE, "", {"renderer": NAME, **figures}).read_text())
    with (RESULTS / f"{NAME}.jsonl").open("w") as f:
        for row in rows:
            item = scored[row["id"]]
            kept = {k: row[k] for k in ("id", "set", "gold", "label")}
            kept |= {"extracted": item["extracted"], "verdicts": item["verdicts"]}
            f.write(json.dumps({**kept, "errors": item["errors"]}, ensure_ascii=False) + "\n")
    print(f"wrote {(RESULTS / f'{NAME}.jsonl').relative_to(ROOT)}")


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
