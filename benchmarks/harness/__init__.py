"""What every benchmark shares, imported by the specs and never run; benchmarks/README.md says
what each module holds. Nothing here imports oncurve at module level where `gpu_check.py`
reaches it: on a GPU image oncurve comes from the checkout's `src` through the children's
PYTHONPATH."""
