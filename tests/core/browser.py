"""A headless Chromium driven through the Chrome DevTools Protocol, with the standard
library only (a minimal WebSocket client): what the HTML report's tests open pages in.

``Browser.start()`` finds Debian's ``/usr/bin/chromium`` (installing the ``chromium``
package with apt-get when it is missing and apt is there, as on a fresh CI machine).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--remote-debugging-port=0"]


def find_chromium(install: bool = True) -> str | None:
    """The Chromium binary; installed from Debian's packages when missing and possible."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}")
                                       else None)
        if found:
            return found
    if install and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=900)
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], env=env,
                       capture_output=True, timeout=1800)
        return find_chromium(install=False)
    return None


class WebSocket:
    """Text frames over one TCP connection (RFC 6455, client side, no extensions)."""

    def __init__(self, url: str, timeout: float = 60.0):
        m = re.match(r"ws://([^/:]+):(\d+)(/.*)", url)
        host, port, path = m.group(1), int(m.group(2)), m.group(3)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket"
                           f"\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           f"Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("websocket handshake: connection closed")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake refused: {head[:200]!r}")
        self.buffer = head.split(b"\r\n\r\n", 1)[1]

    def send(self, text: str) -> None:
        data, mask = text.encode(), os.urandom(4)
        n = len(data)
        header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                                  bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                                  bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("websocket closed")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def recv(self) -> str:
        parts = []
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)
            opcode = b0 & 0x0F
            if opcode == 0x8:
                raise ConnectionError("websocket closed by the browser")
            if opcode in (0x1, 0x0, 0x2):
                parts.append(payload)
                if b0 & 0x80:
                    return b"".join(parts).decode()

    def close(self) -> None:
        self.sock.close()


class Browser:
    """One headless Chromium with one page; ``events`` keeps what the page reported."""

    def __init__(self, binary: str):
        self.profile = tempfile.mkdtemp(prefix="torchloom-chromium-")
        self.proc = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
                                      "about:blank"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        port = self._port()
        # keep reading its stderr, so that chromium never blocks on a full pipe
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        deadline = time.time() + 60
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
            if pages or time.time() > deadline:
                break
            time.sleep(0.2)
        self.ws = WebSocket(pages[0]["webSocketDebuggerUrl"])
        self.next_id = 0
        self.events: list[dict] = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def _port(self) -> int:
        for line in self.proc.stderr:  # "DevTools listening on ws://127.0.0.1:PORT/..."
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                return int(m.group(1))
        raise RuntimeError("chromium exited before it listened for DevTools")

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def open(self, path: Path, timeout: float = 120.0) -> float:
        """Load a local file; returns seconds until the page's script said it is ready."""
        t0 = time.perf_counter()
        self.events.clear()
        self.call("Page.navigate", url=path.resolve().as_uri())
        while self.evaluate("document.readyState") != "complete" or \
                self.evaluate("document.body && document.body.dataset.ready") != "1":
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"{path} not ready after {timeout} s; "
                                   f"errors: {self.errors()}")
            if self.errors():
                break
            time.sleep(0.05)
        return time.perf_counter() - t0

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries the page produced."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append(json.dumps(p["exceptionDetails"])[:2000])
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error",
                                                                                 "assert"):
                out.append(" ".join(str(a.get("value", a.get("description")))
                                    for a in p.get("args", [])))
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def screenshot(self, path: Path, width: int = 1400, height: int = 1000) -> None:
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        shot = self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)
