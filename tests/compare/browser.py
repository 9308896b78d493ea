"""A real headless Chromium driven through the DevTools protocol, for report.html tests.

Chromium's ``--remote-debugging-pipe`` takes protocol commands on file descriptor 3 and writes
replies and events on 4, each message JSON ended by a NUL byte: the standard library is enough
(no websocket client, no Playwright). One browser per test module (a module-scoped fixture);
each test opens pages in it, clicks with real mouse events, reads the DOM back and takes
screenshots.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SKIP_REASON = "chromium is not installed (apt-get install -y chromium; `make test` installs it)"


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium process; ``page()`` opens a tab attached through a flat session."""

    def __init__(self, width: int = 1400, height: int = 1800, timeout: float = 120.0):
        if CHROMIUM is None:
            raise BrowserError(SKIP_REASON)
        self.width, self.height, self.timeout = width, height, timeout
        self._profile = tempfile.mkdtemp(prefix="tsprobe-chromium-")
        cmd_r, cmd_w = os.pipe()        # we write commands, Chromium reads them on fd 3
        out_r, out_w = os.pipe()        # Chromium writes on fd 4, we read
        # above 10 so that placing them on 3 and 4 in the child cannot overwrite each other
        high_r, high_w = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
        os.close(cmd_r)
        os.close(out_w)

        def on_fds_3_and_4():
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--no-first-run", "--no-default-browser-check", f"--user-data-dir={self._profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=on_fds_3_and_4)
        os.close(high_r)
        os.close(high_w)
        self._w, self._r = cmd_w, out_r
        self._buf = b""
        self._id = 0
        self.events: List[Dict[str, Any]] = []

    def send(self, method: str, params: Optional[dict] = None, session: Optional[str] = None) -> Dict[str, Any]:
        """One command; its result (raises on a protocol error)."""
        self._id += 1
        msg: Dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._next()
            if m.get("id") == self._id:
                if "error" in m:
                    raise BrowserError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, session: Optional[str] = None) -> Dict[str, Any]:
        for i, m in enumerate(self.events):
            if m.get("method") == method and (session is None or m.get("sessionId") == session):
                return self.events.pop(i)
        while True:
            m = self._next()
            if m.get("method") == method and (session is None or m.get("sessionId") == session):
                return m
            self.events.append(m)

    def _next(self) -> Dict[str, Any]:
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._r], [], [], self.timeout)
            if not ready:
                raise BrowserError(f"no reply from chromium in {self.timeout} s")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium exited (code {self.proc.poll()})")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def page(self, url: str) -> "Page":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session, target)
        page.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
        page.send("Page.enable")
        page.send("Runtime.enable")
        page.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired", session)
        return page

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)


class Page:
    def __init__(self, browser: Browser, session: str, target: str):
        self.browser, self.session, self.target = browser, session, target

    def send(self, method: str, params: Optional[dict] = None) -> Dict[str, Any]:
        return self.browser.send(method, params, self.session)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable); raises on a throw."""
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression[:80]}: {r['exceptionDetails'].get('exception', r['exceptionDetails'])}")
        return r["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed, released) at the centre of the first element matching."""
        box = self.js(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            if (!e) return null; e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();
            return [r.left + Math.min(r.width / 2, 60), r.top + r.height / 2]; }})()""")
        if box is None:
            raise BrowserError(f"no element {selector!r}")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                   "clickCount": 1})

    def screenshot(self, path: Path, full: bool = True) -> Path:
        params: Dict[str, Any] = {"format": "png"}
        if full:
            h = self.js("document.documentElement.scrollHeight")
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": self.browser.width,
                                                             "height": min(int(h), 6000), "scale": 1})
        Path(path).write_bytes(base64.b64decode(self.send("Page.captureScreenshot", params)["data"]))
        return Path(path)

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target})
