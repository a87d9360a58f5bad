"""Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe), and a static
file server on 127.0.0.1: enough to load a web app, click, hand a file to its file input and read its
state, with the standard library only (no selenium, playwright or websocket package)."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import http.server
import json
import os
import select
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class CdpError(RuntimeError):
    pass


class Browser:
    """One Chromium process; `send` is a blocking call, events are queued until `wait_event` reads them."""

    def __init__(self, chromium: str, profile: Path, log: Path) -> None:
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def wire_fds() -> None:  # Chromium reads commands on fd 3 and writes replies on fd 4
            # (via fds above 10 first: either end may itself be fd 3 or 4)
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
            for fd, target in zip(high, (3, 4), strict=True):
                os.dup2(fd, target)  # inheritable, unlike the pipe's own fds

        self._log = log.open("w")
        cmd = [chromium, *HEADLESS_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe"]
        self.proc = subprocess.Popen(
            [*cmd, "about:blank"],
            preexec_fn=wire_fds,
            close_fds=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self.targets: list[str] = []  # the tabs opened, for close_tabs

    def close_tabs(self) -> None:
        for target in self.targets:
            with contextlib.suppress(CdpError):
                self.send("Target.closeTarget", {"targetId": target})
        self.targets.clear()
        self.events.clear()

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30) -> dict[str, Any]:  # fmt: skip
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._recv(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)["params"]
            self.events.append(self._recv(deadline))

    def _recv(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._r], [], [], max(left, 0))
            if not ready:
                raise TimeoutError("no reply from Chromium")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise CdpError("Chromium closed the pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def close(self) -> None:
        with contextlib.suppress(CdpError, TimeoutError, OSError):
            self.send("Browser.close", timeout=5)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self._w)
        os.close(self._r)
        self._log.close()


class Page:
    """One tab: navigate, evaluate JavaScript (promises awaited), hand files to a file chooser."""

    def __init__(self, browser: Browser, url: str) -> None:
        self.browser = browser
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        browser.targets.append(target)
        self.session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "DOM"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
        self.send("Page.navigate", {"url": url})

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30) -> dict[str, Any]:
        return self.browser.send(method, params, self.session, timeout)

    def js(self, expression: str, timeout: float = 60, user_gesture: bool = False) -> Any:
        result = self.send(
            "Runtime.evaluate",
            {
                "expression": expression,
                "returnByValue": True,
                "awaitPromise": True,
                "userGesture": user_gesture,
            },
            timeout,
        )
        if "exceptionDetails" in result:
            raise CdpError(json.dumps(result["exceptionDetails"])[:2000])
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> Any:
        """Polls `expression` until it is truthy; its last value (or a TimeoutError)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still falsy after {timeout} s: {expression}")
            time.sleep(0.2)

    def choose_file(self, click_expression: str, path: Path) -> None:
        """Clicks what opens a file chooser (as a user would) and picks `path` in it."""
        self.send("Page.setInterceptFileChooserDialog", {"enabled": True})
        self.js(click_expression, user_gesture=True)
        chooser = self.browser.wait_event("Page.fileChooserOpened")
        self.send("DOM.setFileInputFiles", {"files": [str(path)], "backendNodeId": chooser["backendNodeId"]})

    def set_input_files(self, selector: str, path: Path) -> None:
        """Puts `path` in the <input type=file> that `selector` names (fires its change event)."""
        root = self.send("DOM.getDocument")["root"]["nodeId"]
        node = self.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        if not node:
            raise CdpError(f"no element {selector}")
        self.send("DOM.setFileInputFiles", {"files": [str(path)], "nodeId": node})

    def console_errors(self) -> list[str]:
        """Uncaught exceptions and console.error calls so far."""
        out = []
        for e in self.browser.events:
            if e.get("sessionId") != self.session:
                continue
            if e.get("method") == "Runtime.exceptionThrown":
                out.append(json.dumps(e["params"]["exceptionDetails"])[:500])
            elif e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] == "error":
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in e["params"]["args"]))
        return out

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path


@contextmanager
def chromium(executable: str, workdir: Path) -> Iterator[Browser]:
    profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=workdir))
    browser = Browser(executable, profile, workdir / "chromium.log")
    try:
        yield browser
    finally:
        browser.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def static_server(root: Path) -> Iterator[str]:
    """Serves `root` on 127.0.0.1 (a free port) for the duration; yields its base URL."""
    handler: Callable[..., _QuietHandler] = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
