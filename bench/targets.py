"""What the load generator talks to: fusefleet (submit, then long-poll) or a peer server (one blocking POST)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Protocol

import aiohttp

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

    async def send(self, session: aiohttp.ClientSession, params: dict[str, Any]) -> RequestRecord: ...


def _epoch(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


class FusefleetTarget:
    """POST /v1/requests, then GET ?wait_s= (long poll) until the request ends; with ``fetch_images``, then GET
    each image too (what a peer's one answer carries), before the request counts as done."""

    def __init__(
        self, base_url: str, name: str = "fusefleet", wait_s: float = 30.0, *, fetch_images: bool = False
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = name
        self.wait_s = wait_s
        self.fetch_images = fetch_images

    async def send(self, session: aiohttp.ClientSession, params: dict[str, Any]) -> RequestRecord:
        sent = time.monotonic()
        try:
            async with session.post(f"{self.base_url}/v1/requests", json=params) as answer:
                if answer.status != 202:
                    text = await answer.text()
                    return RequestRecord(sent, time.monotonic(), "rejected", params["width"], error=text[:200])
                rid = (await answer.json())["id"]
            while True:
                url = f"{self.base_url}/v1/requests/{rid}"
                async with session.get(url, params={"wait_s": str(self.wait_s)}) as answer:
                    if answer.status != 200:
                        text = await answer.text()
                        error = f"GET {answer.status}: {text[:200]}"
                        return RequestRecord(sent, time.monotonic(), "error", params["width"], error=error)
                    state = await answer.json()
                if state["status"] in TERMINAL:
                    break
            if self.fetch_images and state["status"] == "succeeded":
                for index in range(len(state["images"])):
                    async with session.get(f"{self.base_url}/v1/requests/{rid}/images/{index}") as answer:
                        body = await answer.read()
                        if answer.status != 200 or not body:
                            error = f"GET image {index}: {answer.status}"
                            return RequestRecord(sent, time.monotonic(), "error", params["width"], error=error)
        except (aiohttp.ClientError, TimeoutError) as exc:
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
    """One blocking POST that answers with the image (BentoML, LitServe; see bench/peers/launch.py)."""

    def __init__(self, base_url: str, name: str) -> None:
        from bench.peers.launch import PEER_ENDPOINTS

        self.url = base_url.rstrip("/") + PEER_ENDPOINTS[name]
        self.name = name

    async def send(self, session: aiohttp.ClientSession, params: dict[str, Any]) -> RequestRecord:
        from bench.peers.launch import peer_payload

        sent = time.monotonic()
        try:
            async with session.post(self.url, json=peer_payload(self.name, params)) as answer:
                body = await answer.read()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return RequestRecord(sent, time.monotonic(), "error", params["width"], error=repr(exc))
        ok = status == 200 and len(body) > 0
        return RequestRecord(
            sent_at=sent,
            done_at=time.monotonic(),
            status="succeeded" if ok else "failed",
            width=params["width"],
            error=None if ok else f"HTTP {status}: {body[:200]!r}",
        )
