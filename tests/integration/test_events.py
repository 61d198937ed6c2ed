"""Live request events (Server-Sent Events) against a real fleet: api, scheduler and a worker process running
``ChaosRunner`` (simulated forwards of ``SIM_*`` ms, faults asked for in the prompt; no model to load).

Each stream is read through the Python client (``fusefleet.client``), one raw, and one through ``fusefleet watch``:
the order queued -> scheduled -> running -> progress... -> terminal, the stream closing after the terminal event,
resuming with ``Last-Event-ID`` mid-run and after the end, failed and aborted requests, the multi-request stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from fusefleet.client import Client, Event, RequestStatus
from fusefleet.client_cli import run_watch
from shared.events import ProgressEvent, RunningEvent, ScheduledEvent
from tests.support.fleet import Fleet, fleet_fixture
from tests.support.runners import RAISE_BEFORE

EVENTS_ENV = {
    "FUSEFLEET_RUNNER": "tests.support.runners:ChaosRunner",
    # a forward takes 600 ms + 600 ms per image: 300 ms a step at 4 steps, every step's event goes out
    "FUSEFLEET_SIM_BASE_MS": "600",
    "FUSEFLEET_SIM_PER_IMAGE_MS": "600",
    "FUSEFLEET_MAX_NUM_SEQS": "4",
    "FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS": "300",
    "FUSEFLEET_SCHEDULER_LEASE_MS": "1500",
    "FUSEFLEET_EVENT_PING_S": "0.5",
}


fleet = fleet_fixture(EVENTS_ENV, "events-fleet")


@pytest.fixture
def client(fleet: Fleet) -> Iterator[Client]:
    with Client(fleet.base_url, timeout=30) as one:
        yield one


def _names(events: list[Event]) -> list[str]:
    return [event.name for event in events]


def _check_order(events: list[Event], terminal: str) -> None:
    """queued, scheduled, running, progress (steps rising, the last one the total)..., then ``terminal``."""
    names = _names(events)
    assert names[:3] == ["queued", "scheduled", "running"], names
    assert names[-1] == terminal and set(names[3:-1]) <= {"progress"}, names
    steps = [(event.data.step, event.data.total) for event in events if isinstance(event.data, ProgressEvent)]
    assert [step for step, _ in steps] == sorted({step for step, _ in steps}), steps
    if terminal == "succeeded":
        assert steps and steps[-1][0] == steps[-1][1], steps


def test_events_come_live_in_order_and_the_stream_ends(fleet: Fleet, client: Client) -> None:
    request_id = fleet.submit(num_inference_steps=4)
    received: list[tuple[float, Event]] = []
    for event in client.events(request_id):  # ends by itself after the terminal event
        received.append((time.time(), event))
    events = [event for _, event in received]
    _check_order(events, "succeeded")
    assert all(event.request_id == request_id for event in events)
    scheduled, running = events[1].data, events[2].data
    assert isinstance(scheduled, ScheduledEvent) and scheduled.batch_size >= 1
    assert isinstance(running, RunningEvent) and running.worker.startswith("worker0@")
    view = events[-1].view
    assert view is not None and view.status is RequestStatus.SUCCEEDED and view.batch_id == scheduled.batch_id
    assert view.images == [f"/v1/requests/{request_id}/images/0"]
    assert view.finished_at is not None and view.started_at is not None
    # live, not replayed at the end: the running event was in hand before the request finished
    running_at = next(at for at, event in received if event.name == "running")
    assert running_at < view.finished_at.timestamp(), fleet.logs_hint()


def test_a_reconnect_resumes_after_the_last_event_mid_run_and_after_the_end(fleet: Fleet, client: Client) -> None:
    request_id = fleet.submit(num_inference_steps=4)
    first: list[Event] = []
    for event in client.events(request_id):
        first.append(event)
        if event.name == "running":
            break  # the connection is dropped mid-run
    rest = list(client.events(request_id, last_event_id=first[-1].last_event_id))
    _check_order(first + rest, "succeeded")
    assert _names(first + rest) == _names(list(client.events(request_id)))  # nothing lost, nothing twice

    # after the end: from a point before the terminal event, it still comes; from the terminal event, nothing
    tail = list(client.events(request_id, last_event_id=rest[-2].last_event_id))
    assert _names(tail) == ["succeeded"] and tail[0].view == rest[-1].view
    started = time.monotonic()
    assert list(client.events(request_id, last_event_id=rest[-1].last_event_id)) == []
    assert time.monotonic() - started < 2.0


def test_failed_and_aborted_requests_end_their_streams(fleet: Fleet, client: Client) -> None:
    failing = fleet.submit(prompt=f"a fox {RAISE_BEFORE}", num_inference_steps=4)
    events = list(client.events(failing))
    _check_order(events, "failed")
    view = events[-1].view
    assert view is not None and view.error is not None and view.error.type == "ChaosError", view

    slow = fleet.submit(n=4, num_inference_steps=8)  # a 3 s forward
    events = []
    for event in client.events(slow):
        events.append(event)
        if event.name == "running":
            assert client.abort(slow) in (RequestStatus.RUNNING, RequestStatus.ABORTED)
    _check_order(events, "aborted")
    assert events[-1].view is not None and events[-1].view.images == []


def test_one_stream_follows_many_requests(fleet: Fleet, client: Client) -> None:
    ids = fleet.submit_batch([{"prompt": f"fox {i}", "num_inference_steps": 4} for i in range(3)])
    events = list(client.watch(ids))
    for request_id in ids:
        _check_order([event for event in events if event.request_id == request_id], "succeeded")
    batches = [event.data for event in events if isinstance(event.data, ScheduledEvent)]
    for batch in batches:  # the batch each says it joined holds that many of them
        assert batch.batch_size == sum(other.batch_id == batch.batch_id for other in batches)
    # the SSE id holds each request's position: resuming from any event yields exactly the events after it
    middle = len(events) // 2
    resumed = list(client.watch(ids, last_event_id=events[middle].last_event_id))
    assert [(e.request_id, e.name, e.last_event_id) for e in resumed] == [
        (e.request_id, e.name, e.last_event_id) for e in events[middle + 1 :]
    ]


def test_the_raw_stream_and_fusefleet_watch(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    request_id = fleet.submit(n=2, num_inference_steps=4)  # 1.8 s: keep-alive comments go out meanwhile
    lines: list[str] = []
    with httpx.stream("GET", f"{fleet.base_url}/v1/requests/{request_id}/events", timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = list(response.iter_lines())  # the server closes the stream after the terminal event
    assert any(line.startswith(":") for line in lines), lines  # a keep-alive comment (event_ping_s=0.5)
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert names[0] == "queued" and names[-1] == "succeeded"
    assert len([line for line in lines if line.startswith("id: ")]) == len(names)

    assert run_watch(fleet.base_url, [request_id], as_json=False, last_event_id=None) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"{request_id} queued"
    images = " ".join(f"/v1/requests/{request_id}/images/{k}" for k in range(2))
    assert printed[-1] == f"{request_id} succeeded {images}"
    failing = fleet.submit(prompt=f"an owl {RAISE_BEFORE}", num_inference_steps=1)
    assert run_watch(fleet.base_url, [failing], as_json=True, last_event_id=None) == 1
