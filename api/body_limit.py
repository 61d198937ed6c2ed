"""``BodyLimit``: a pure ASGI middleware that answers 413 to HTTP request bodies larger than a limit.

A declared ``Content-Length`` above the limit is refused before the app runs. A body without one (chunked or
streamed) is counted as it arrives: the chunk that crosses the limit is never handed to the app, which has
therefore buffered at most ``max_body_bytes``; whatever the app answers to the cut body is dropped and the 413
is sent instead (unless the app had already started its response, which it cannot do before reading the body).
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    """Raised to the app from ``receive`` when the body grew past the limit."""


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimit:
    """Refuse request bodies over ``max_body_bytes`` with 413 ``{"detail": ...}`` and ``Connection: close``."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._refuse(send)
            return

        received = 0
        exceeded = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            if exceeded:
                raise BodyTooLarge(self.max_body_bytes)
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    exceeded = True
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded and not started:
                return  # the app's answer to a cut body; the 413 replaces it
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not exceeded or started:
                raise
        if exceeded and not started:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        detail = f"request body exceeds this server's max_body_bytes ({self.max_body_bytes} bytes)"
        body = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
