"""HTTP request bodies over ``max_body_bytes`` get 413, declared (Content-Length) or streamed (chunked)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from starlette.types import Message, Receive, Scope, Send

from api.body_limit import BodyLimit, BodyTooLarge
from shared.settings import Settings
from tests.support.api import Api, unit_settings

pytestmark = pytest.mark.anyio

LIMIT = 1024  # the smallest max_body_bytes Settings accepts
JSON = {"content-type": "application/json"}
DETAIL = f"request body exceeds this server's max_body_bytes ({LIMIT} bytes)"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return unit_settings(tmp_path, max_body_bytes=LIMIT, max_prompt_chars=4000)


def _body(size: int) -> bytes:
    """A valid submission of exactly ``size`` bytes."""
    head = b'{"prompt": "'
    tail = b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


async def _chunks(body: bytes, size: int = 100) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


async def test_declared_length_over_limit_is_413(api: Api) -> None:
    response = await api.http.post("/v1/requests", content=_body(LIMIT + 1), headers=JSON)
    assert response.status_code == 413
    assert response.json() == {"detail": DETAIL}
    assert await api.redis.xlen(api.keys.requests) == 0


async def test_streamed_body_over_limit_is_413(api: Api) -> None:
    response = await api.http.post(
        "/v1/requests/batch", content=_chunks(_body(LIMIT * 5)), headers=JSON
    )
    assert "content-length" not in response.request.headers  # sent chunked
    assert response.status_code == 413
    assert response.json() == {"detail": DETAIL}
    assert response.headers["connection"] == "close"
    assert await api.redis.xlen(api.keys.requests) == 0


@pytest.mark.parametrize("streamed", [False, True])
async def test_body_at_the_limit_is_accepted(api: Api, streamed: bool) -> None:
    body = _body(LIMIT)
    content = _chunks(body) if streamed else body
    response = await api.http.post("/v1/requests", content=content, headers=JSON)
    assert response.status_code == 202, response.text


async def _record_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body, then answers 200 with the byte count (what a route would do)."""
    seen = 0
    scope["seen"] = 0
    while True:
        message = await receive()
        seen += len(message.get("body", b""))
        scope["seen"] = seen
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(seen).encode()})


async def _drive(
    app: BodyLimit, chunks: list[bytes], headers: list[tuple[bytes, bytes]]
) -> tuple[Scope, list[Message], int]:
    """Run ``app`` on a request whose body arrives in ``chunks``: (scope, messages sent, receive() calls)."""
    scope: Scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    pulled = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal pulled
        pulled += 1
        if pulled > len(chunks):
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunks[pulled - 1], "more_body": pulled < len(chunks)}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return scope, sent, pulled


async def test_streamed_body_never_reaches_the_app_past_the_limit() -> None:
    chunks = [b"a" * 400] * 10
    scope, sent, pulled = await _drive(BodyLimit(_record_app, LIMIT), chunks, [])
    assert scope["seen"] == 800  # the third chunk (crossing 1024) was not handed over
    assert pulled == 3  # and nothing after it was read
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"]) == {"detail": DETAIL}
    assert len(sent) == 2  # the app's own answer was dropped


async def test_declared_length_is_refused_before_the_app_runs() -> None:
    chunks = [b"a" * 2000]
    scope, sent, pulled = await _drive(BodyLimit(_record_app, LIMIT), chunks, [(b"content-length", b"2000")])
    assert "seen" not in scope and pulled == 0
    assert sent[0]["status"] == 413


async def test_app_raising_on_the_cut_body_still_gets_413() -> None:
    async def strict_app(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body"):
            pass

    _, sent, _ = await _drive(BodyLimit(strict_app, LIMIT), [b"a" * 600] * 3, [])
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [413]


async def test_other_errors_pass_through() -> None:
    async def broken_app(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await _drive(BodyLimit(broken_app, LIMIT), [b"a"], [])


async def test_too_late_for_413_once_the_app_answered() -> None:
    async def eager_app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        while (await receive()).get("more_body"):
            pass

    with pytest.raises(BodyTooLarge):  # the response is under way: the error is the app's to handle
        await _drive(BodyLimit(eager_app, LIMIT), [b"a" * 600] * 3, [])
