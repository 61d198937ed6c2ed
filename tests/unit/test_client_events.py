"""``Client.events`` / ``watch`` and their async twins: typed events, reconnecting with ``Last-Event-ID`` when a
stream drops before the terminal event (and through 503s), bounded by ``reconnect_s``; and the api's stream ending
with a comment when Redis fails under it.

The reconnect cases answer from a scripted transport (a stream that drops, a 503), the way the other client retry
tests do; the in-process app serves the rest."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest

from fusefleet.client import ApiUnreachable, AsyncClient, Client, NotFound, Unavailable
from fusefleet.client_cli import describe_event
from shared.settings import Settings
from shared.state import parse_state
from shared.wire import RequestView
from tests.support.api import Api, api_harness, unit_settings
from tests.support.scripted import scripted
from tests.support.specs import demo_spec

pytestmark = pytest.mark.anyio
RID = "r1"


def _sse(*events: tuple[str, str, dict[str, object]]) -> httpx.Response:
    body = "".join(f"id: {sse_id}\nevent: {name}\ndata: {json.dumps(data)}\n\n" for sse_id, name, data in events)
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def _view(status: str) -> dict[str, object]:
    """The api's view of request ``RID`` in ``status`` (succeeded: one image), as a terminal event carries it."""
    spec = demo_spec(RID, 4, side=64, prompt="a fox")
    results = "r1/c1/0.png" if status == "succeeded" else ""
    state = parse_state({"spec": spec.model_dump_json(), "status": status, "results": results})
    view: dict[str, object] = RequestView.from_state(state).model_dump(mode="json")
    return view


def _dropping_then_503_then_the_rest() -> list[httpx.Response]:
    return [
        _sse(("1-0", "queued", {"id": RID}), ("2-0", "progress", {"id": RID, "step": 1, "total": 4})),  # drops
        httpx.Response(503, json={"detail": "Redis is unavailable"}, headers={"Retry-After": "0"}),
        _sse(("3-0", "surprise", {"id": RID}), ("4-0", "succeeded", _view("succeeded"))),  # unknown: skipped
    ]


def _check_resumed(events: list[object], seen: list[httpx.Request]) -> None:
    assert [(e.name, e.last_event_id) for e in events] == [  # type: ignore[attr-defined]
        ("queued", "1-0"),
        ("progress", "2-0"),
        ("succeeded", "4-0"),
    ]
    assert [request.headers.get("Last-Event-ID") for request in seen] == [None, "2-0", "2-0"]
    assert seen[0].url.path == f"/v1/requests/{RID}/events"
    view = events[-1].view  # type: ignore[attr-defined]
    assert view is not None and view.images == [f"/v1/requests/{RID}/images/0"]


def test_a_dropped_stream_is_resumed_after_the_last_event() -> None:
    transport, seen = scripted(_dropping_then_503_then_the_rest())
    with Client("http://api", transport=transport) as client:
        events = list(client.events(RID))
    _check_resumed(events, seen)
    assert [describe_event(event) for event in events] == [
        f"{RID} queued",
        f"{RID} progress 1/4",
        f"{RID} succeeded /v1/requests/{RID}/images/0",
    ]


async def test_the_async_client_resumes_too() -> None:
    transport, seen = scripted(_dropping_then_503_then_the_rest())
    async with AsyncClient("http://api", transport=transport) as client:
        events = [event async for event in client.events(RID)]
    _check_resumed(events, seen)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (lambda: httpx.Response(503, json={"detail": "down"}, headers={"Retry-After": "0"}), Unavailable),
        (lambda: _sse(("1-0", "queued", {"id": RID})), ApiUnreachable),  # closes early, every time
    ],
)
def test_reconnecting_gives_up_after_reconnect_s(answer: Callable[[], httpx.Response], error: type) -> None:
    transport, seen = scripted([answer()])
    with Client("http://api", transport=transport) as client, pytest.raises(error):
        started = time.monotonic()
        for _ in client.events(RID, reconnect_s=0.5):
            pass
    assert time.monotonic() - started < 3.0 and len(seen) >= 2


def test_an_unknown_request_is_not_retried() -> None:
    transport, seen = scripted([httpx.Response(404, json={"detail": "no request 'r1'"})])
    with Client("http://api", transport=transport) as client, pytest.raises(NotFound):
        list(client.events(RID))
    assert len(seen) == 1


async def test_a_stream_whose_redis_fails_ends_with_a_comment(tmp_path: Path) -> None:
    settings: Settings = unit_settings(tmp_path, redis_socket_timeout_s=1.0)  # waits of 0.5 s at most
    async for api in api_harness(settings):
        request_id = await _submit(api)

        started = time.monotonic()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_outage, api)
            response = await api.http.get(f"/v1/requests/{request_id}/events")
        api.server.connected = True
        assert response.status_code == 200
        lines = response.text.splitlines()
        assert lines[:2] == [lines[0], "event: queued"] and lines[0].startswith("id: ")
        assert any(line.startswith(": ") and "unavailable" in line for line in lines), lines
        assert time.monotonic() - started < 0.2 + 0.5 + settings.redis_socket_timeout_s + 1


async def _outage(api: Api) -> None:
    await anyio.sleep(0.2)  # the stream is waiting for the next event by now
    api.server.connected = False


async def _submit(api: Api) -> str:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat"})
    assert response.status_code == 202, response.text
    request_id: str = response.json()["id"]
    return request_id
