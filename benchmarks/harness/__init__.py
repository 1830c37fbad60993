"""What every benchmark shares, imported by the specs and never run: where the checkout's files are
(`checkout`), the machine (`machine`), the models built from a config (`models`), child processes
with their time limits and peak memory (`children`), what an oncurve run logged (`run_logs`), one
GRPO job for both trainers (`spec`), TRL's environment and child (`trl_env`, `trl_child`), results
as JSON rows (`records`) and markdown rendered from them (`tables`), every record's figures in the
READMEs' tables (`figures`), one update and its batch through the package's public seams for the
micro-benchmarks (`updates`), one trainer against another on the arith job (`comparison`), what the
learning-curve studies share, their curves drawn as a figure included (`learning`), a check run as
stages with time limits (`stages`; the GPU check's tests stage through `pytest_outcomes`, what an
offline GPU machine needs in `gpu_bundle`); and for one spec each, samplers timed against
`generate` (`sampling`), a trainer's run on one GPU (`gpu_comparison`), peers' answer checkers in
their own environment's child (`peer_child`).

Nothing here imports oncurve at module level where `gpu_check.py` reaches it: on a GPU image
oncurve comes from the checkout's `src` through the children's PYTHONPATH."""
