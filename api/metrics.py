"""Prometheus metrics of the api process: ``GET /metrics`` (text exposition format, not in the OpenAPI schema).

Each app has its own ``CollectorRegistry`` (not the process-global one), so several apps in one process (tests) do
not clash. It holds:

* ``fusefleet_api_requests_submitted_total``: requests queued by ``api.submission.accept`` (one per spec, every
  surface);
* ``fusefleet_api_requests_refused_total{reason}``: submissions ``accept`` refused, ``invalid`` (422: a limit, the
  fleet's capabilities or an input image) or ``queue_full`` (503);
* gauges read from Redis at scrape time, in one pipelined round trip bounded by ``redis_socket_timeout_s``:
  ``fusefleet_queue_depth`` (entries of the request stream), ``fusefleet_oldest_waiting_seconds`` (age of its first
  entry by Redis time, 0 when empty), ``fusefleet_batches_in_flight`` and ``fusefleet_workers_live`` (heartbeat
  newer than ``worker_ttl_s``, by Redis time); ``fusefleet_up`` says whether Redis answered: 0 (and none of the
  others) when it did not, and ``/metrics`` still answers 200.

``accept`` reaches the counters through the app's ``RequestStore`` (the one handle it is given): ``ApiMetrics.attach``
sets the store's ``counters`` at start-up (a store without them counts nothing).
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.store import RefusalReason, RequestStore
from shared.fleet_state import FleetReader, FleetSnapshot


class _FleetCollector(Collector):
    """Exports the snapshot the route read just before rendering (``fusefleet_up`` 0 and nothing else without)."""

    def __init__(self) -> None:
        self.snapshot: FleetSnapshot | None = None

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot
        yield GaugeMetricFamily(
            "fusefleet_up", "Whether Redis answered this scrape (1) or not (0).", 1 if snapshot is not None else 0
        )
        if snapshot is None:
            return
        yield GaugeMetricFamily(
            "fusefleet_queue_depth", "Requests waiting in the request stream.", snapshot.queue_depth
        )
        yield GaugeMetricFamily(
            "fusefleet_oldest_waiting_seconds",
            "Age of the oldest entry of the request stream by Redis time (0 when empty).",
            snapshot.oldest_waiting_s,
        )
        yield GaugeMetricFamily(
            "fusefleet_batches_in_flight", "Batches published with unfinished requests.", snapshot.batches_in_flight
        )
        yield GaugeMetricFamily(
            "fusefleet_workers_live", "Workers whose heartbeat is newer than worker_ttl_s.", snapshot.workers_live
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected at scrape time only (the registry must not call collect() at registration)


class ApiMetrics:
    """The metrics of one app: its registry, the submission counters and the fleet gauges."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.submitted = Counter(
            "fusefleet_api_requests_submitted",
            "Requests queued (one per request of a batch), every API surface.",
            registry=self.registry,
        )
        self.refused = Counter(
            "fusefleet_api_requests_refused",
            "Submissions refused: invalid (422) or queue_full (503).",
            ["reason"],
            registry=self.registry,
        )
        for reason in ("invalid", "queue_full"):
            self.refused.labels(reason=reason)  # exported at 0 from the start
        self._collector = _FleetCollector()
        self.registry.register(self._collector)
        self._reader: FleetReader | None = None

    def attach(self, store: RequestStore, reader: FleetReader) -> None:
        """Count what is submitted through ``store`` (what ``accept`` is given) and read the gauges with
        ``reader``."""
        store.counters = self
        self._reader = reader

    def count_submitted(self, count: int) -> None:
        self.submitted.inc(count)

    def count_refused(self, reason: RefusalReason) -> None:
        self.refused.labels(reason=reason).inc()

    async def render(self) -> bytes:
        """The exposition text: the gauges read now, then every metric of the registry."""
        self._collector.snapshot = await self._reader.read() if self._reader is not None else None
        return generate_latest(self.registry)  # no await since the read: a concurrent scrape cannot interleave


router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition; 200 with ``fusefleet_up 0`` when Redis does not answer."""
    api_metrics: ApiMetrics = request.app.state.metrics
    return Response(await api_metrics.render(), media_type=CONTENT_TYPE_LATEST)
