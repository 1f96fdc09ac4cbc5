"""Driving a page in headless Chromium over the DevTools protocol (the web console's tests: test_console.py)."""

from __future__ import annotations

import asyncio
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DevTools:
    """A page in headless Chromium, spoken to over the DevTools protocol (aiohttp's websocket client)."""

    def __init__(self, ws):
        self.ws, self.next_id = ws, 0

    async def call(self, method: str, **params):
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            reply = await self.ws.receive_json(timeout=30)
            if reply.get("id") == self.next_id:
                assert "error" not in reply, reply
                return reply.get("result", {})

    async def evaluate(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def key(self, key: str, code: str, vk: int, text: str = "", modifiers: int = 0):
        for kind in ("keyDown", "keyUp"):
            await self.call("Input.dispatchKeyEvent", type=kind, key=key, code=code, windowsVirtualKeyCode=vk,
                            nativeVirtualKeyCode=vk, modifiers=modifiers, **({"text": text} if text and
                                                                             kind == "keyDown" else {}))

    async def type(self, text: str):
        for ch in text:
            await self.key(ch, "", ord(ch.upper()) if ch.isalpha() else ord(ch), text=ch)
            await asyncio.sleep(0.02)

    async def wait_for(self, expression: str, timeout: float = 20.0, what: str | None = None):
        """Poll `expression` in the page until it is truthy; its value. Fails after `timeout` saying `what`."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                value = await self.evaluate(expression)
            except AssertionError:  # the page was between documents (a navigation): look again
                value = None
            if value:
                return value
            if asyncio.get_running_loop().time() >= deadline:
                raise AssertionError(f"not within {timeout:g} s: {what or expression}")
            await asyncio.sleep(0.05)

    async def open(self, url: str, ready: str = "document.readyState === 'complete'"):
        """Navigate to `url` and wait until the new document has loaded (and `ready` holds)."""
        await self.evaluate("window.__left = true")
        await self.call("Page.navigate", url=url)
        await self.wait_for(f"!window.__left && {ready}", what=f"{url} never loaded")

    async def text(self, selector: str = "body") -> str:
        return await self.evaluate(f"(document.querySelector({selector!r}) || {{}}).innerText || ''")


class Chromium:
    """Headless Chromium (Debian's chromium-headless-shell) on a fresh profile, and one page of it over the DevTools
    protocol: `async with Chromium(binary, profile) as tab:`. Stopped (its process group) on the way out."""

    def __init__(self, binary: str, profile, size: str = "1280,860"):
        self.binary, self.profile, self.size = binary, profile, size
        self.process = self.http = self.ws = None

    async def __aenter__(self) -> DevTools:
        import subprocess
        import time

        import aiohttp

        self.process = subprocess.Popen([self.binary, "--headless", "--no-sandbox", "--disable-gpu",
                                         "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
                                         f"--window-size={self.size}", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (active.exists() and active.read_text().strip()):
            assert time.monotonic() < deadline, "Chromium never opened its DevTools port"
            await asyncio.sleep(0.05)
        port = active.read_text().split()[0]
        self.http = aiohttp.ClientSession()
        async with self.http.get(f"http://127.0.0.1:{port}/json") as reply:
            page = next(t for t in await reply.json() if t["type"] == "page")
        self.ws = await self.http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        tab = DevTools(self.ws)
        await tab.call("Page.enable")
        return tab

    async def __aexit__(self, *exc) -> None:
        import os
        import signal
        import subprocess

        if self.ws is not None:
            await self.ws.close()
        if self.http is not None:
            await self.http.close()
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
