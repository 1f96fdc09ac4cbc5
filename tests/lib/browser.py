"""Driving a page in headless Chromium over the DevTools protocol (the dashboard's --web tests), on a free port."""

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
