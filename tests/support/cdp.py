"""A small driver for headless Debian `chromium` over the DevTools protocol, standard library
only: `--remote-debugging-pipe` speaks NUL-separated JSON on file descriptors 3 (commands
in) and 4 (replies and events out), so no websocket client is needed."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tasks.host.processes import die_with_parent


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def pipe_fds(commands: int, replies: int) -> None:
    """In the child: the DevTools pipe on fds 3 and 4, both inheritable across exec.

    dup2 onto the same fd is a no-op that keeps close-on-exec, so a pipe that already is
    3 or 4 is made inheritable explicitly (else chromium finds its pipe fds closed).
    """
    die_with_parent()
    if commands == 4 or replies == 3:  # one would overwrite the other: move them first
        commands, replies = os.dup(commands), os.dup(replies)
    for fd, target in ((commands, 3), (replies, 4)):
        if fd != target:
            os.dup2(fd, target)  # the copy dup2 makes is inheritable
        os.set_inheritable(target, True)


class Browser:
    """One headless chromium; each `Tab` is a page in its own browser context (cookies)."""

    def __init__(self, binary: str) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="playrun-chromium-"))
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        self.proc = subprocess.Popen(
            [binary, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--disable-background-networking", "--disable-dev-shm-usage",
             f"--user-data-dir={self.profile}", "--window-size=1280,1000", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=lambda: pipe_fds(to_child_r, from_child_w),
            start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self._next_id = 0
        self._buffer = b""
        self._pending: list[dict[str, Any]] = []

    # -- protocol ----------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def call(self, method: str, session: str | None = None, timeout: float = 30.0,
             **params: Any) -> dict[str, Any]:
        self._next_id += 1
        ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == ident:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self._pending.append(reply)

    def wait_event(self, method: str, session: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self._pending):
                if event.get("method") == method and event.get("sessionId") == session:
                    del self._pending[i]
                    params: dict[str, Any] = event.get("params", {})
                    return params
            self._pending.append(self._read_message(deadline))

    def tab(self) -> Tab:
        context = self.call("Target.createBrowserContext")["browserContextId"]
        target = self.call("Target.createTarget", url="about:blank",
                           browserContextId=context)["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        return Tab(self, session)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
        shutil.rmtree(self.profile, ignore_errors=True)


class Tab:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session
        self.call("Page.enable")
        self.call("Network.enable")
        self.statuses: list[int] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.browser.call(method, self.session, **params)

    def disable_javascript(self) -> None:
        self.call("Emulation.setScriptExecutionDisabled", value=True)

    def open(self, url: str) -> int:
        """Navigate and wait for the load event; the main document's HTTP status."""
        self.browser._pending.clear()
        frame = self.call("Page.navigate", url=url)
        if frame.get("errorText"):
            raise RuntimeError(f"navigation to {url} failed: {frame['errorText']}")
        return self._loaded()

    def _loaded(self) -> int:
        self.browser.wait_event("Page.loadEventFired", self.session)
        statuses = [e["params"]["response"]["status"] for e in self.browser._pending
                    if e.get("method") == "Network.responseReceived"
                    and e.get("sessionId") == self.session
                    and e["params"].get("type") == "Document"]
        return int(statuses[-1]) if statuses else 0

    def _focus(self, selector: str) -> None:
        root = self.call("DOM.getDocument", depth=0)["root"]
        node = self.call("DOM.querySelector", nodeId=root["nodeId"], selector=selector)["nodeId"]
        if not node:
            raise AssertionError(f"no element matches {selector!r}")
        self.call("DOM.focus", nodeId=node)

    def type(self, selector: str, text: str) -> None:
        """Focus a field and type into it (browser input: works with page scripts off)."""
        self._focus(selector)
        self.call("Input.insertText", text=text)

    def press(self, selector: str) -> int:
        """Focus a button and press Enter on it, as a keyboard user would; wait for the load."""
        self._focus(selector)
        self.browser._pending.clear()
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                      windowsVirtualKeyCode=13, **({"text": "\r"} if kind == "keyDown" else {}))
        return self._loaded()

    def dom(self) -> str:
        """The rendered document (what --dump-dom prints), read without page scripts."""
        root = self.call("DOM.getDocument", depth=-1)["root"]
        html: str = self.call("DOM.getOuterHTML", nodeId=root["nodeId"])["outerHTML"]
        return html

    def count(self, selector: str) -> int:
        root = self.call("DOM.getDocument", depth=0)["root"]
        return len(self.call("DOM.querySelectorAll", nodeId=root["nodeId"],
                             selector=selector)["nodeIds"])

    def url(self) -> str:
        history = self.call("Page.getNavigationHistory")
        return str(history["entries"][history["currentIndex"]]["url"])

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png",
                                          captureBeyondViewport=True)["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return data
