"""A headless Chromium driven over the DevTools protocol on a pipe, so that no Python package is
needed: open a page, collect what its console reported as errors, evaluate expressions in it."""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome")
INSTALL = "sudo apt-get install chromium"


def find_browser() -> str | None:
    """The path of the first of BINARIES on PATH, or None."""
    return next(filter(None, map(shutil.which, BINARIES)), None)


class Browser:
    """One headless Chromium with one page, closed on leaving the `with` block. Every call
    raises TimeoutError when the browser has not answered within `timeout` seconds."""

    def __init__(self, binary: str, profile: Path, timeout: float = 30.0) -> None:
        self.timeout = timeout
        to_browser, self._commands = os.pipe()
        self._replies, from_browser = os.pipe()

        def onto_fds_3_and_4() -> None:
            # --remote-debugging-pipe reads commands from fd 3 and writes replies to fd 4. Both
            # ends go above 4 first so that neither dup2 overwrites the other; the copies close
            # on exec, like the pipes' own descriptors, while dup2's 3 and 4 are inherited.
            read, write = (
                fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser, from_browser)
            )
            os.dup2(read, 3)
            os.dup2(write, 4)

        self._process = subprocess.Popen(
            [
                binary,
                "--headless",
                # Chromium's sandbox refuses root and needs user namespaces that containers
                # often lack; the pages opened are the test's own files
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-extensions",
                "about:blank",
            ],
            # pass_fds closes, after preexec_fn, every descriptor it was not given, and it can
            # only be given 3 and 4 where the parent happens to have them open
            close_fds=False,
            preexec_fn=onto_fds_3_and_4,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._pending, self._events, self._last_id = b"", [], 0
        try:
            (page,) = [
                t for t in self._call("Target.getTargets")["targetInfos"] if t["type"] == "page"
            ]
            attached = self._call("Target.attachToTarget", targetId=page["targetId"], flatten=True)
            self._session = attached["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self._call(f"{domain}.enable", session=self._session)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open(self, url: str) -> list[str]:
        """Load `url` in the page and wait for its load event; return the console's errors
        while it loaded (console.error calls, uncaught exceptions, failed loads), as text."""
        self._events.clear()
        self._call("Page.navigate", session=self._session, url=url)
        self._wait_for("Page.loadEventFired")
        return [text for text in map(_console_error, self._events) if text is not None]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page, a promise awaited; RuntimeError
        with the page's message when it throws."""
        reply = self._call(
            "Runtime.evaluate",
            session=self._session,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            raise RuntimeError(details.get("exception", {}).get("description", details["text"]))
        return reply["result"].get("value")

    def close(self) -> None:
        """Ask the browser to close, kill it if it does not within 5 seconds, free the pipes."""
        if self._process.poll() is None:
            try:
                self._send("Browser.close")
                self._process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        for fd in (self._commands, self._replies):
            if fd >= 0:  # -1: closed by an earlier call
                os.close(fd)
        self._commands = self._replies = -1

    def _send(self, method: str, session: str | None = None, **params: Any) -> int:
        self._last_id += 1
        message = {"id": self._last_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        return self._last_id

    def _call(self, method: str, session: str | None = None, **params: Any) -> dict:
        """Send a command and return its result; the events that arrive first are kept."""
        sent = self._send(method, session, **params)
        while (message := self._receive()).get("id") != sent:
            self._events.append(message)
        if "error" in message:
            raise RuntimeError(f"{method}: {message['error']}")
        return message["result"]

    def _wait_for(self, event: str) -> None:
        while (message := self._receive()).get("method") != event:
            self._events.append(message)

    def _receive(self) -> dict:
        """The next message (JSON ended by a NUL byte) from the browser."""
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                raise TimeoutError(f"the browser sent nothing for {self.timeout:g} s")
            chunk = os.read(self._replies, 1 << 16)
            if not chunk:
                raise EOFError(f"the browser exited (code {self._process.wait()})")
            self._pending += chunk
        message, self._pending = self._pending.split(b"\0", 1)
        return json.loads(message)


def _console_error(event: dict) -> str | None:
    """An error's text from a DevTools event, None for any other event."""
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
        return " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
    if method == "Runtime.exceptionThrown":
        details = params["exceptionDetails"]
        return details.get("exception", {}).get("description", details["text"])
    if method == "Log.entryAdded" and params["entry"]["level"] == "error":
        entry = params["entry"]
        return f"{entry['text']} ({entry.get('url', '')})"
    return None
