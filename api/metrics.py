"""Prometheus metrics of the whole fleet, served by the api: ``GET /metrics`` (text exposition format, not in the
OpenAPI schema). One scrape of any api replica covers every process of the fleet: what the scheduler and the
workers count lives in Redis (``shared.metrics``) and is read at scrape time. docs/operations.md lists every metric.

Each app has its own ``CollectorRegistry`` (not the process-global one), so several apps in one process (tests) do
not clash. It holds:

* ``fusefleet_api_requests_submitted_total``: requests queued by ``api.submission.accept`` (one per spec, every
  surface);
* ``fusefleet_api_requests_refused_total{reason}``: submissions ``accept`` refused, ``invalid`` (422: a limit, the
  fleet's capabilities or an input image), ``queue_full`` (503), an API key's ``rate_limited`` or ``max_queued``
  (429), or ``input_budget`` (429, 413: ``api.input_budget``);
* the fleet, read from Redis at scrape time in one pipelined round trip bounded by ``redis_socket_timeout_s``
  (``shared.fleet_state``): the queue (``fusefleet_queue_depth``, ``fusefleet_oldest_waiting_seconds``), the
  batches in flight, the worker slots live and busy, and the fleet-wide counters and histograms of ``P:metrics``
  (requests by terminal status, failures by type, aborts by stage, batch sizes, admission waits, forward time by
  batch size, step time, images, out-of-memory splits; ``fleet_metrics``). ``fusefleet_up`` says whether Redis
  answered: 0 (and none of the fleet's metrics) when it did not, and ``/metrics`` still answers 200.

``accept`` reaches the counters through the app's store (the one handle it is given; a sharded fleet's is every
shard's, ``api.shard_router``, whose fleet reads are summed over shards): ``ApiMetrics.attach`` sets the store's
``counters`` at start-up (a store without them counts nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import get_args

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from api.shard_router import Fleet, Store
from api.store import RefusalReason
from shared.fleet_state import FleetSnapshot
from shared.metrics import Histogram


def _histogram(name: str, documentation: str, histogram: Histogram) -> HistogramMetricFamily:
    buckets = [(repr(float(bound)), count) for bound, count in histogram.buckets]
    return HistogramMetricFamily(
        name, documentation, buckets=[*buckets, ("+Inf", histogram.count)], sum_value=histogram.sum
    )


def _labelled(name: str, documentation: str, label: str, values: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, count in sorted(values.items()):
        family.add_metric([value], count)
    return family


def _batch_knees(snapshot: FleetSnapshot) -> GaugeMetricFamily:
    """The batch cap by model and request pixel cost: the lowest knee the model's live workers announce (as the
    scheduler applies it, ``scheduler.knees``)."""
    lowest: dict[tuple[str, int], int] = {}
    for worker in snapshot.workers:
        if worker.live and worker.capabilities is not None:
            for served in worker.capabilities.served:
                for knee in served.batch_knees:
                    key = (served.model, knee.cost)
                    lowest[key] = min(lowest.get(key, knee.knee), knee.knee)
    family = GaugeMetricFamily(
        "fusefleet_batch_knee",
        "Largest batch that still gains throughput, by model and request pixel cost (the scheduler caps there).",
        labels=["model", "pixels"],
    )
    for (model, cost), cap in sorted(lowest.items()):
        family.add_metric([model, str(cost)], cap)
    return family


def fleet_metrics(snapshot: FleetSnapshot) -> Iterator[Metric]:
    """Every metric of the fleet in ``snapshot``: gauges, then the counters and histograms of ``P:metrics``."""
    yield GaugeMetricFamily("fusefleet_queue_depth", "Requests waiting in the request stream.", snapshot.queue_depth)
    yield GaugeMetricFamily(
        "fusefleet_oldest_waiting_seconds",
        "Age of the oldest entry of the request stream by Redis time (0 when empty).",
        snapshot.oldest_waiting_s,
    )
    yield GaugeMetricFamily(
        "fusefleet_batches_in_flight", "Batches published with unfinished requests.", snapshot.batches_in_flight
    )
    yield GaugeMetricFamily(
        "fusefleet_workers_live",
        "Worker slots (one per worker process) whose heartbeat is newer than worker_ttl_s.",
        snapshot.workers_live,
    )
    yield GaugeMetricFamily(
        "fusefleet_worker_slots_busy",
        "Batches in flight holding a worker slot (published or running; not those storing their outputs).",
        snapshot.slots_busy,
    )
    yield GaugeMetricFamily(
        "fusefleet_queued_input_bytes",
        "Bytes of input images held in Redis by unfinished requests (under max_queued_input_bytes).",
        snapshot.input_bytes,
    )
    counters = snapshot.counters
    yield CounterMetricFamily("fusefleet_requests_accepted", "Requests accepted (202).", value=counters.accepted)
    yield _labelled(
        "fusefleet_requests_finished",
        "Requests that reached a terminal status, by status (succeeded, failed, aborted).",
        "status",
        counters.finished,
    )
    yield _labelled(
        "fusefleet_request_failures", "Failed requests by error type (error.type).", "type", counters.failures
    )
    yield _labelled(
        "fusefleet_aborts",
        "Aborted requests by the status the abort caught them in (queued, scheduled, running).",
        "stage",
        counters.aborts,
    )
    yield _histogram("fusefleet_batch_size", "Requests per batch the scheduler formed.", counters.batch_size)
    yield _histogram(
        "fusefleet_admission_wait_seconds",
        "Time from a request's acceptance to joining a batch, by Redis time (queueing plus the admission wait).",
        counters.admission_wait,
    )
    forward = SummaryMetricFamily(
        "fusefleet_forward_seconds", "Wall time of one pipeline forward, by requests in it.", labels=["batch_size"]
    )
    for size, (count, seconds) in sorted(counters.forwards.items()):
        forward.add_metric([str(size)], count_value=count, sum_value=seconds)
    yield forward
    yield _histogram(
        "fusefleet_step_seconds", "Mean denoising step time of each forward (forward time / steps).", counters.step
    )
    yield CounterMetricFamily(
        "fusefleet_images", "Images (or videos) produced by forwards; rate() is images/s.", value=counters.images
    )
    yield CounterMetricFamily(
        "fusefleet_oom_splits", "Fused forwards split in two after running out of memory.", value=counters.oom_splits
    )
    loads = SummaryMetricFamily(
        "fusefleet_model_load_seconds",
        "Model loads by workers (at start and on demand) and their seconds, by model.",
        labels=["model"],
    )
    for model, (count, seconds) in sorted(counters.model_loads.items()):
        loads.add_metric([model], count_value=count, sum_value=seconds)
    yield loads
    yield _labelled(
        "fusefleet_model_evictions",
        "Models evicted by workers to load another (least recently used, max_resident_models), by model.",
        "model",
        counters.model_evictions,
    )
    yield _batch_knees(snapshot)
    yield _labelled(
        "fusefleet_prompt_cache_lookups",
        "Prompt rows workers looked up in their prompt-embedding cache: hit (found encoded) or miss (encoded).",
        "outcome",
        counters.prompt_cache,
    )
    yield _labelled(
        "fusefleet_webhooks",
        "Webhook delivery outcomes (delivered, dropped, superseded progress, retried failed attempts).",
        "outcome",
        counters.webhooks,
    )


class _FleetCollector(Collector):
    """Exports the snapshot the route read just before rendering (``fusefleet_up`` 0 and nothing else without)."""

    def __init__(self) -> None:
        self.snapshot: FleetSnapshot | None = None

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot
        yield GaugeMetricFamily(
            "fusefleet_up", "Whether Redis answered this scrape (1) or not (0).", 1 if snapshot is not None else 0
        )
        if snapshot is not None:
            yield from fleet_metrics(snapshot)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected at scrape time only (the registry must not call collect() at registration)


class ApiMetrics:
    """The metrics of one app: its registry, this process's submission counters and the fleet's metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.submitted = Counter(
            "fusefleet_api_requests_submitted",
            "Requests queued (one per request of a batch), every API surface.",
            registry=self.registry,
        )
        self.refused = Counter(
            "fusefleet_api_requests_refused",
            "Submissions refused: invalid (422), queue_full (503), an API key's rate_limited or max_queued (429), "
            "or input_budget (429, 413: max_queued_input_bytes).",
            ["reason"],
            registry=self.registry,
        )
        for reason in get_args(RefusalReason):
            self.refused.labels(reason=reason)  # exported at 0 from the start
        self._collector = _FleetCollector()
        self.registry.register(self._collector)
        self._reader: Fleet | None = None

    def attach(self, store: Store, reader: Fleet) -> None:
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
