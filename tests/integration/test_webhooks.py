"""Webhooks on a real fleet (api, scheduler with its dispatcher, a worker running the simulated runner: no model to
load) against a real HTTP receiver on 127.0.0.1 (explicitly allowed): delivery, signature, retry, order."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from shared.webhooks import SIGNATURE_HEADER, verify
from tests.support.fleet import Fleet, fleet_fixture
from tests.support.processes import wait_for

SECRET = "integration-secret"
WEBHOOK_ENV = {
    "FUSEFLEET_RUNNER": "bench.runners:SimulatedGpuRunner",
    "FUSEFLEET_SIM_BASE_MS": "400",  # 100 ms a step at 4 steps
    "FUSEFLEET_SIM_PER_IMAGE_MS": "0",
    "FUSEFLEET_MAX_NUM_SEQS": "4",
    "FUSEFLEET_SCHEDULER_LEASE_MS": "1500",
    "FUSEFLEET_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",  # the receiver: loopback only because it is listed
    "FUSEFLEET_WEBHOOK_SECRET": SECRET,
    "FUSEFLEET_WEBHOOK_RETRY_INITIAL_S": "0.3",
    "FUSEFLEET_WEBHOOK_TIMEOUT_S": "5",
}


@dataclass
class Delivery:
    at: float
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


@dataclass
class Receiver:
    """An HTTP server on a free port of 127.0.0.1 that answers 500 to the first ``fail_first`` POSTs, then 204."""

    fail_first: int = 1
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve in a thread for the ``with`` block; its URL."""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    status = 500 if len(receiver.deliveries) < receiver.fail_first else 204
                    receiver.deliveries.append(Delivery(time.time(), status, dict(self.headers), body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/hooks/fusefleet"
        finally:
            server.shutdown()
            server.server_close()

    def accepted(self) -> list[Delivery]:
        with self.lock:
            return [delivery for delivery in self.deliveries if delivery.status == 204]


fleet = fleet_fixture(WEBHOOK_ENV, "webhooks-fleet")


def test_start_and_completed_arrive_signed_in_order_once_each_after_a_retry(fleet: Fleet) -> None:
    receiver = Receiver(fail_first=1)
    with receiver.serve() as url:
        hooked = fleet.submit(webhook=url, webhook_events=["start", "completed"])
        plain = fleet.submit()  # no webhook: nothing in the outbox, nothing delivered
        states = fleet.wait_done([hooked, plain], timeout=60)
        assert {state["status"] for state in states.values()} == {"succeeded"}
        wait_for(lambda: len(receiver.accepted()) >= 2, 30, f"2 accepted deliveries ({fleet.logs_hint()})")
        time.sleep(1.0)  # anything delivered twice would arrive now

    first, *rest = receiver.deliveries
    assert first.status == 500 and first.json["event"] == "start"  # the first attempt failed ...
    accepted = receiver.accepted()
    assert [d.json["event"] for d in accepted] == ["start", "completed"]  # ... its retry went first, once each
    assert len(receiver.deliveries) == 3, [(d.status, d.json["event"]) for d in receiver.deliveries]
    assert accepted[0].at - first.at >= 0.3  # webhook_retry_initial_s
    for delivery in receiver.deliveries:
        assert verify(SECRET, delivery.headers[SIGNATURE_HEADER], delivery.body, now=time.time())
        assert delivery.json["request_id"] == hooked
        assert delivery.headers["Content-Type"] == "application/json"
    assert first.json["event_id"] == accepted[0].json["event_id"]  # the same event, signed anew
    start, completed = (d.json for d in accepted)
    assert start["data"] == {"id": hooked, "worker": states[hooked]["worker"]}
    assert completed["data"] == states[hooked]  # the request's view, as GET /v1/requests/{id} answers
    # the event ids are the request's SSE event ids
    stream = {entry_id: fields["event"] for entry_id, fields in fleet.redis.xrange(fleet.keys.request_events(hooked))}
    assert stream[start["event_id"]] == "running" and stream[completed["event_id"]] == "succeeded"
    # every outbox entry was delivered and deleted; no other request had one
    assert fleet.redis.xlen(fleet.keys.webhooks) == 0
    counters = fleet.redis.hgetall(fleet.keys.metrics)
    assert counters.get("webhooks:delivered") == "2" and counters.get("webhooks:retried") == "1"
    assert "webhooks:dropped" not in counters
    assert not fleet.redis.hexists(fleet.keys.request(plain), "webhook")
    assert fleet.redis.hget(fleet.keys.request(hooked), "webhook_error") is None
    finished_at = datetime.fromisoformat(states[hooked]["finished_at"]).timestamp()
    print(  # the figures of docs/reliability.md (pytest -s)
        f"webhooks: start failed (500), its retry accepted {accepted[0].at - first.at:.3f} s later; completed "
        f"delivered {accepted[1].at - finished_at:.3f} s after the request finished"
    )
