"""An asyncio event loop on a daemon thread of its own, for synchronous callers that await.

One loop serves a process for its life, as TRL's trainer keeps one for its async reward
functions: what a coroutine binds to its loop on a first call (an `asyncio.Semaphore`, an
`httpx.AsyncClient` made at import) still works on the next. The caller's thread may run a loop
of its own (a notebook's): the coroutines never run there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any


class BackgroundLoop:
    """An event loop started at first use on a daemon thread named `name`, and again in a
    forked child, where the parent's thread is gone."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    def submit(
        self, coroutine: Coroutine, on_new_loop: Callable[[], None] | None = None
    ) -> concurrent.futures.Future:
        """Schedule `coroutine` on the loop; its future. `on_new_loop` is called, under the
        lock, when the loop is (re)started for it."""
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                if on_new_loop is not None:
                    on_new_loop()
                self.loop = asyncio.new_event_loop()
                self.thread = threading.Thread(
                    target=self.loop.run_forever, name=self.name, daemon=True
                )
                self.thread.start()
            return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine) -> Any:
        """What `coroutine` returns (or raises), run on the loop; blocks until then."""
        return self.submit(coroutine).result()
