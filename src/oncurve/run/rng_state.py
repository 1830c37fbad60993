"""The random generators' states of one process, as JSON-able data and back, so that a resumed
run draws the same numbers as one that never stopped."""

import random

import numpy as np
import torch


def get_rng_state() -> dict:
    """The states of this process's python, numpy and torch CPU generators, and of the CUDA
    ones where CUDA is in use, as JSON-able lists."""
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss_next],
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached_gaussian],
        "torch": torch.get_rng_state().tolist(),
    }
    # Only when CUDA is in use: asking for its state would otherwise initialise it.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    """Restore the generators from a `get_rng_state()` dict; CUDA's only where it was saved
    and a device is available, each device's that this process sees (a resume that sees fewer
    devices than the save did skips the rest: no rank of it can use them)."""
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        for device, saved in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(torch.tensor(saved, dtype=torch.uint8), device)
