"""What the load generator talks to: fusefleet (submit, then long-poll) or a peer server (one blocking POST)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Protocol

import httpx

TERMINAL = ("succeeded", "failed", "aborted")


@dataclass
class RequestRecord:
    """One request as the client saw it (monotonic seconds) plus what the server reported."""

    sent_at: float
    done_at: float
    status: str
    width: int
    batch_size: int | None = None
    queue_wait_s: float | None = None  # server side: created -> started (fusefleet only)
    error: str | None = None

    @property
    def latency_s(self) -> float:
        return self.done_at - self.sent_at

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "latency_s": self.latency_s}


class Target(Protocol):
    name: str

    async def send(self, client: httpx.AsyncClient, params: dict[str, Any]) -> RequestRecord: ...


def _epoch(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


class FusefleetTarget:
    """POST /v1/requests, then GET ?wait_s= (long poll) until the request ends."""

    def __init__(self, base_url: str, name: str = "fusefleet", wait_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = name
        self.wait_s = wait_s

    async def send(self, client: httpx.AsyncClient, params: dict[str, Any]) -> RequestRecord:
        sent = time.monotonic()
        try:
            answer = await client.post(f"{self.base_url}/v1/requests", json=params)
            if answer.status_code != 202:
                return RequestRecord(sent, time.monotonic(), "rejected", params["width"], error=answer.text[:200])
            rid = answer.json()["id"]
            while True:
                state = (await client.get(f"{self.base_url}/v1/requests/{rid}", params={"wait_s": self.wait_s})).json()
                if state["status"] in TERMINAL:
                    break
        except httpx.HTTPError as exc:
            return RequestRecord(sent, time.monotonic(), "error", params["width"], error=repr(exc))
        done = time.monotonic()
        created, started = _epoch(state["created_at"]), _epoch(state["started_at"])
        error = state.get("error")
        return RequestRecord(
            sent_at=sent,
            done_at=done,
            status=state["status"],
            width=params["width"],
            batch_size=state.get("batch_size"),
            queue_wait_s=(started - created) if created and started else None,
            error=f"{error['type']}: {error['message']}" if error else None,
        )


class PeerTarget:
    """One blocking POST that answers with the image (BentoML, LitServe)."""

    def __init__(self, base_url: str, path: str, name: str) -> None:
        self.url = base_url.rstrip("/") + path
        self.name = name

    async def send(self, client: httpx.AsyncClient, params: dict[str, Any]) -> RequestRecord:
        sent = time.monotonic()
        try:
            answer = await client.post(self.url, json=params)
        except httpx.HTTPError as exc:
            return RequestRecord(sent, time.monotonic(), "error", params["width"], error=repr(exc))
        ok = answer.status_code == 200 and len(answer.content) > 0
        return RequestRecord(
            sent_at=sent,
            done_at=time.monotonic(),
            status="succeeded" if ok else "failed",
            width=params["width"],
            error=None if ok else f"HTTP {answer.status_code}: {answer.text[:200]}",
        )
