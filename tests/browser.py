"""A real headless Chromium (Debian's ``chromium``), driven over the Chrome DevTools Protocol.

Blocking by design (the ``websockets`` sync client): a test runs each call on a worker thread
(``trio.to_thread.run_sync``) while its server keeps serving. Every call has a deadline: a
command gets ``COMMAND_SECONDS`` for its answer, a wait its own ``seconds``; the browser gets
``START_SECONDS`` to come up. ``open_browser`` always kills the browser process it started.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import websockets.sync.client as ws_client

CHROMIUM = "/usr/bin/chromium"
START_SECONDS = 30
COMMAND_SECONDS = 20


class BrowserError(RuntimeError):
    pass


class Page:
    """One tab: navigate, evaluate JavaScript, click like a mouse, type, screenshot."""

    def __init__(self, url: str) -> None:
        self._socket = ws_client.connect(url, max_size=None, open_timeout=COMMAND_SECONDS)
        self._ids = itertools.count(1)

    def close(self) -> None:
        self._socket.close()

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One CDP command and its result (events that arrive meanwhile are skipped)."""
        ident = next(self._ids)
        self._socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + COMMAND_SECONDS
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{method}: no answer within {COMMAND_SECONDS} s")
            message = json.loads(self._socket.recv(timeout=left))
            if message.get("id") != ident:
                continue
            if "error" in message:
                raise BrowserError(f"{method}: {message['error']}")
            result: dict[str, Any] = message.get("result", {})
            return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str, seconds: float = COMMAND_SECONDS) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", seconds)

    def wait_for(self, expression: str, seconds: float) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + seconds
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"{expression!r} still false after {seconds} s")
            time.sleep(0.05)

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the middle of the element."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if box is None:
            raise BrowserError(f"nothing matches {selector!r}")
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            extra = {} if kind == "mouseMoved" else {"button": "left", "clickCount": 1}
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)

    def type_into(self, selector: str, text: str) -> None:
        self.click(selector)
        self.send("Input.insertText", text=text)

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))


def _wait_port(profile: Path, process: subprocess.Popen[bytes]) -> tuple[int, str]:
    active = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BrowserError(f"chromium exited with {process.returncode}")
        with contextlib.suppress(OSError, ValueError):
            port, path = active.read_text().split("\n")[:2]
            return int(port), path
        time.sleep(0.05)
    raise BrowserError(f"chromium did not open its DevTools port within {START_SECONDS} s")


@contextlib.contextmanager
def open_browser(width: int = 1280, height: int = 1000) -> Iterator[Page]:
    """A headless Chromium with one blank tab, killed on exit."""
    if shutil.which(CHROMIUM) is None:
        raise BrowserError(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    profile = Path(tempfile.mkdtemp(prefix="mlx-responses-chromium-"))
    process = subprocess.Popen(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # CI runs as root
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    page: Page | None = None
    try:
        port, _ = _wait_port(profile, process)
        tabs = _json(f"http://127.0.0.1:{port}/json/list")
        tab = next(t for t in tabs if t.get("type") == "page")
        page = Page(tab["webSocketDebuggerUrl"])
        page.send("Page.enable")
        page.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        yield page
    finally:
        if page is not None:
            with contextlib.suppress(Exception):
                page.close()
        process.kill()
        process.wait(timeout=COMMAND_SECONDS)
        shutil.rmtree(profile, ignore_errors=True)


def _json(url: str) -> list[dict[str, Any]]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=COMMAND_SECONDS) as reply:
        data: list[dict[str, Any]] = json.loads(reply.read())
    return data
