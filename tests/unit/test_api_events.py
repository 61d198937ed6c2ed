"""The event stream routes in-process on fakeredis: replay and close, resume after ``Last-Event-ID``, the terminal
event's payload, the multi-request stream and its positions, the 4xx answers naming what is wrong, and a stream
whose response never runs holding no slot.

(Live delivery, order against a running worker and reconnects mid-run: tests/integration/test_events.py.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import fakeredis
import httpx
import pytest
from fastapi import Depends, Request
from httpx_sse import EventSource

from api.app import create_app
from api.routes.events import get_slots
from api.stream_slots import StreamSlots
from shared.keys import RedisKeys
from shared.settings import Settings
from tests.support.api import Api, fake_results, finish_like_worker, unit_settings

pytestmark = pytest.mark.anyio
PNG = b"\x89PNG\r\n\x1a\nfake"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return unit_settings(tmp_path, max_event_ids=3)


async def _submit(api: Api) -> str:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat"})
    assert response.status_code == 202, response.text
    request_id: str = response.json()["id"]
    return request_id


async def _events(api: Api, path: str, last_event_id: str | None = None, **params: str) -> list[tuple[str, str, Any]]:
    """(SSE id, event name, data) of a stream that has ended."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    response = await api.http.get(path, params=params, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return [(sse.id, sse.event, json.loads(sse.data)) async for sse in EventSource(response).aiter_sse()]


async def test_a_finished_request_replays_its_events_and_the_stream_closes(api: Api) -> None:
    request_id = await _submit(api)
    await api.finish(request_id, "succeeded", [PNG])
    events = await _events(api, f"/v1/requests/{request_id}/events")
    assert [name for _, name, _ in events] == ["queued", "succeeded"]
    assert events[0][2] == {"id": request_id}
    view = events[1][2]  # the terminal event carries the request's state, as GET /v1/requests/{id} has it
    assert view["status"] == "succeeded"
    assert view["images"] == [f"/v1/requests/{request_id}/images/0"]
    assert view == (await api.http.get(f"/v1/requests/{request_id}")).json()
    entry_ids = [entry_id for entry_id, _ in await api.redis.xrange(api.keys.request_events(request_id))]
    assert [sse_id for sse_id, _, _ in events] == entry_ids  # the SSE id is the stream entry id


async def test_last_event_id_resumes_after_that_event(api: Api) -> None:
    request_id = await _submit(api)
    await api.finish(request_id, "failed", error=("ValueError", "the prompt broke it"))
    path = f"/v1/requests/{request_id}/events"
    (first, _, _), (last, name, view) = await _events(api, path)
    assert name == "failed" and view["error"] == {"type": "ValueError", "message": "the prompt broke it"}
    assert await _events(api, path, last_event_id=first) == [(last, name, view)]
    # it has everything: 204, on which a browser's EventSource stops reconnecting
    response = await api.http.get(path, headers={"Last-Event-ID": last})
    assert response.status_code == 204 and response.content == b""


async def test_a_request_without_a_terminal_event_still_ends_its_stream(api: Api) -> None:
    # e.g. one that ended before its events were written (an older fleet): its terminal event comes from its state
    request_id = await _submit(api)
    await api.http.post(f"/v1/requests/{request_id}/abort")
    await api.redis.delete(api.keys.request_events(request_id))
    path = f"/v1/requests/{request_id}/events"
    events = await _events(api, path)
    assert [(name, data["status"]) for _, name, data in events] == [("aborted", "aborted")]
    response = await api.http.get(path, headers={"Last-Event-ID": events[0][0]})
    assert response.status_code == 204  # told once: a reconnect after it gets nothing more


async def test_bad_requests_are_refused_naming_what_is_wrong(api: Api) -> None:
    request_id = await _submit(api)
    response = await api.http.get("/v1/requests/nope/events")
    assert response.status_code == 404 and "nope" in response.json()["detail"]
    response = await api.http.get(f"/v1/requests/{request_id}/events", headers={"Last-Event-ID": "yesterday"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["header", "Last-Event-ID"]

    response = await api.http.get("/v1/events", params={"ids": "a,b,c,d"})  # max_event_ids=3
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "ids"]
    assert "max_event_ids" in response.json()["detail"][0]["msg"]
    response = await api.http.get("/v1/events", params={"ids": " , "})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["query", "ids"]
    response = await api.http.get("/v1/events", params={"ids": f"{request_id},gone"})
    assert response.status_code == 404 and "'gone'" in response.json()["detail"]
    response = await api.http.get("/v1/events", params={"ids": request_id}, headers={"Last-Event-ID": "1-0,2-0"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["header", "Last-Event-ID"]


async def test_the_multi_request_stream_merges_events_and_resumes_each_request(api: Api) -> None:
    a, b = await _submit(api), await _submit(api)
    await api.finish(b, "succeeded", [PNG])
    await api.finish(a, "failed", error=("ValueError", "no"))
    ids = f"{a},{b},{a}"  # a repeat is watched once
    events = await _events(api, "/v1/events", ids=ids)
    assert [(data["id"], name) for _, name, data in events] == [
        (a, "queued"),
        (b, "queued"),
        (b, "succeeded"),
        (a, "failed"),
    ]
    entries = {rid: [e for e, _ in await api.redis.xrange(api.keys.request_events(rid))] for rid in (a, b)}
    # each SSE id holds every request's position, in the order of ids (empty: nothing sent yet)
    assert [sse_id for sse_id, _, _ in events] == [
        f"{entries[a][0]},",
        f"{entries[a][0]},{entries[b][0]}",
        f"{entries[a][0]},{entries[b][1]}",
        f"{entries[a][1]},{entries[b][1]}",
    ]
    resumed = await _events(api, "/v1/events", last_event_id=events[1][0], ids=ids)
    assert resumed == events[2:]
    response = await api.http.get("/v1/events", params={"ids": ids}, headers={"Last-Event-ID": events[-1][0]})
    assert response.status_code == 204


async def test_the_routes_are_documented_as_event_streams(api: Api) -> None:
    paths = (await api.http.get("/openapi.json")).json()["paths"]
    for path in ("/v1/requests/{request_id}/events", "/v1/events"):
        responses = paths[path]["get"]["responses"]
        assert "text/event-stream" in responses["200"]["content"]
        assert {"204", "404", "422", "503"} <= set(responses)


async def _end_after_the_route(request: Request) -> AsyncIterator[None]:
    """A function-scoped dependency whose exit, after the route returned and before its response runs, raises
    ``app.state.gap_ends``: what a cancellation delivered in that gap raises, or an error."""
    yield
    raise request.app.state.gap_ends


async def _slots_then_a_gap(
    request: Request, _: Annotated[None, Depends(_end_after_the_route, scope="function")]
) -> StreamSlots:
    slots: StreamSlots = request.app.state.event_slots
    return slots


@pytest.mark.parametrize(
    "gap_ends", [asyncio.CancelledError(), RuntimeError("its exit failed")], ids=["cancelled", "error"]
)
async def test_a_stream_whose_response_never_runs_holds_no_slot(tmp_path: Path, gap_ends: BaseException) -> None:
    """The route returned its stream and the response never ran (the task cancelled, the client gone, or an error
    in between): today's main took the slot in the route and gave it back only in the response, so it stayed taken
    for good, and the holder's one slot refused every later stream (429)."""
    settings = unit_settings(tmp_path, max_event_streams_per_key=1)
    server = fakeredis.FakeServer()
    redis = fakeredis.FakeAsyncRedis(server=server, decode_responses=True)
    results = fake_results(server, settings)
    app = create_app(settings, redis=redis, results=results)
    app.state.gap_ends = gap_ends
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http:
            submitted = await http.post("/v1/requests", json={"prompt": "a cat"})
            request_id = submitted.json()["id"]
            app.dependency_overrides[get_slots] = _slots_then_a_gap
            with pytest.raises(type(gap_ends)):
                await http.get(f"/v1/requests/{request_id}/events")
            assert app.state.event_slots.open == 0
            del app.dependency_overrides[get_slots]
            await finish_like_worker(redis, results, RedisKeys(settings.key_prefix), request_id, "succeeded", [PNG])
            response = await http.get(f"/v1/requests/{request_id}/events")
            assert response.status_code == 200, response.text  # its one slot is free
            assert app.state.event_slots.open == 0  # and given back once the stream ended
    await redis.aclose()
