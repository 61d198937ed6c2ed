"""The webhook dispatcher: POSTs the entries of the webhook outbox (``P:webhooks``) to the requests' webhooks.

It runs as a thread of every ``fusefleet scheduler`` process; one of them is active (its own lease,
``P:webhooks:lease``, TTL ``scheduler_lease_ms``), the others stand by, so one request's events are delivered by
one dispatcher, in order (``scheduler.webhook_queue``). The Lua scripts write the outbox atomically with each
state change and never wait for the dispatcher: a slow or dead receiver slows no request.

The active dispatcher reads the outbox through the consumer group ``webhooks`` (consumer ``active``). A new leader
first reads the group's pending entries (those its predecessor read but did not finish, whatever it died of), then
new ones. Each delivery, in a pool of ``webhook_concurrency`` threads:

1. reads the request (its webhook, its retry count, and for ``completed`` its state): a request that is gone
   (deleted, expired) is dropped;
2. checks the URL against ``webhook_allowed_hosts`` again, resolves the host and checks every address
   (``shared.webhook_hosts``), then connects to the address it checked (no second resolution: no DNS rebinding);
   a refusal drops the event at once;
3. POSTs the signed JSON body (``shared.webhooks.envelope``, ``Fusefleet-Signature``) with ``webhook_timeout_s``
   for the connection, the upload and the answer, no redirects followed, no proxy from the environment, no
   connection kept;
4. 2xx: delivered. Anything else: retried after ``retry_delay_s``; after ``webhook_max_attempts`` dropped.

What became of an attempt is recorded by ``webhook_outcome.lua`` (ack and delete; the request's ``webhook_error``;
its ``webhook_attempt`` count; the ``webhooks:*`` counters). Delivery is at least once: an entry whose outcome
could not be recorded (Redis away, the dispatcher killed after the POST) is delivered again by the next leader.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import httpx
import redis

from scheduler.lease import LeaderLoop, Lease
from scheduler.webhook_queue import DeliveryQueue, Pending
from shared.events import event_name, is_terminal, progress_data
from shared.keys import WEBHOOK_CONSUMER, WEBHOOK_GROUP, WEBHOOK_OUTCOME, RedisKeys
from shared.settings import Settings
from shared.state import STATE_FIELDS, parse_state
from shared.streams import by_stream
from shared.webhook_hosts import HostRules, IpAddress, WebhookRefused, WebhookUrl, parse_url
from shared.webhooks import (
    ATTEMPT_FIELD,
    SIGNATURE_HEADER,
    URL_FIELD,
    OutboxEntry,
    attempt_record,
    envelope,
    failed_attempts,
    signature_header,
    webhook_event,
)
from shared.wire import RequestView

log = logging.getLogger(__name__)

READ_COUNT = 100  # outbox entries read per call
MAX_HELD = 10_000  # entries held in memory at most; the rest wait in the outbox
BUSY_BLOCK_MS = 50  # longest read while deliveries are in flight (their outcome is looked at after it)
USER_AGENT = "fusefleet-webhooks"

Resolver = Callable[[str, int], Sequence[str]]
OutcomeKind = Literal["delivered", "failed", "dropped", "superseded"]


def resolve_host(host: str, port: int) -> list[str]:
    """The addresses of ``host`` (the system resolver; its own timeouts bound it)."""
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one delivery attempt came to; ``failed_attempts`` counts this one when it failed."""

    kind: OutcomeKind
    failed_attempts: int
    problem: str = ""


def pinned_request(url: WebhookUrl, address: IpAddress) -> tuple[str, dict[str, str], dict[str, Any]]:
    """The URL to connect to ``address`` (the checked one) instead of resolving ``url``'s host again, with the
    ``Host`` header and TLS server name (SNI and certificate check) of the original host."""
    parts = urlsplit(url.url)
    host = f"[{address}]" if address.version == 6 else str(address)
    target = urlunsplit((url.scheme, f"{host}:{url.port}", parts.path or "/", parts.query, ""))
    extensions: dict[str, Any] = {"sni_hostname": url.host} if url.scheme == "https" else {}
    return target, {"Host": parts.netloc}, extensions


def event_data(entry: OutboxEntry, raw: Mapping[str, str]) -> dict[str, Any]:
    """The event's SSE payload (``shared.events``): from the outbox entry, or the request's view for a terminal one."""
    name = event_name({"event": entry.event})
    if is_terminal(name):
        return RequestView.from_state(parse_state(raw)).model_dump(mode="json")
    return progress_data(entry.request_id, name, entry.fields).model_dump(mode="json")


class WebhookDispatcher:
    """Leader election, outbox reading and the delivery pool around ``DeliveryQueue``."""

    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        *,
        http: httpx.Client | None = None,
        resolve: Resolver = resolve_host,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        wanted: Callable[[], bool] | None = None,
        name: str = "webhook dispatcher",
    ) -> None:
        """``wanted``: whether this process is to lead now (a sharded fleet's spread, ``scheduler.shard_leaders``;
        None: always contend); ``name`` names the leader in the log lines (with its shard)."""
        self._redis = client
        self._settings = settings
        self._keys = RedisKeys(settings.key_prefix)
        self._rules: HostRules = settings.webhook_rules
        secret = settings.webhook_secret
        self._secret = secret.get_secret_value() if secret is not None else None
        self._lease = Lease(client, self._keys.webhooks_lease, settings.scheduler_lease_ms)
        self._leader = LeaderLoop(
            self._lease, self._lead, name=name, clock=clock, standby=self._stand_by, wanted=wanted
        )
        self._queue = DeliveryQueue(
            max_attempts=settings.webhook_max_attempts, retry_initial_s=settings.webhook_retry_initial_s
        )
        self._http = http or httpx.Client(
            timeout=httpx.Timeout(settings.webhook_timeout_s),
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_connections=settings.webhook_concurrency, max_keepalive_connections=0),
            headers={"User-Agent": USER_AGENT},
        )
        self._resolve = resolve
        self._clock = clock
        self._wall_clock = wall_clock
        self._pool = ThreadPoolExecutor(settings.webhook_concurrency, thread_name_prefix="webhook")
        self._futures: dict[Future[Outcome], Pending] = {}
        self._outcome = client.register_script(WEBHOOK_OUTCOME)

    # --- leadership --------------------------------------------------------------------------------------------
    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="webhook-dispatcher", daemon=True)
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        """Stand by until the lease is ours, lead until it is lost or ``stop`` is set; repeat
        (``scheduler.lease.LeaderLoop``). Never raises: a Redis outage (or a bug) is logged and retried with a
        backoff. While standing by it records the outcome of the deliveries still in flight."""
        try:
            self._leader.run(stop)
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._http.close()

    def _lead(self, stop: threading.Event) -> None:
        self._ensure_group()
        self._queue.clear_waiting()
        backlog: str | None = "0"  # first the entries read before (pending), then new ones
        renewal = self._leader.renewal()
        while not stop.is_set():
            now = self._clock()
            if renewal.due(now) and not renewal.renew(now):
                self._queue.clear_waiting()
                return
            self._collect(leading=True)
            if backlog is not None:
                entries = self._read(backlog, None)
                backlog = entries[-1][0] if entries else None
            elif len(self._queue) < MAX_HELD:
                entries = self._read(">", self._block_ms(renewal.until_due_s(now)))
            else:
                entries = []
                stop.wait(self._block_ms(self._lease.renew_every_s) / 1000)
            self._hold(entries)
            self._dispatch()

    def _stand_by(self) -> None:
        """Before each attempt to lead: record what the deliveries in flight came to; hold nothing else."""
        self._collect(leading=False)

    def _block_ms(self, until_renewal_s: float) -> int:
        wait_s = min(self._settings.scheduler_block_ms / 1000, max(until_renewal_s, 0.0))
        if self._futures:
            wait_s = min(wait_s, BUSY_BLOCK_MS / 1000)
        due = self._queue.next_due()
        if due is not None:
            wait_s = min(wait_s, max(due - self._clock(), 0.0))
        return max(1, int(wait_s * 1000))

    # --- the outbox --------------------------------------------------------------------------------------------
    def _ensure_group(self) -> None:
        try:
            self._redis.xgroup_create(self._keys.webhooks, WEBHOOK_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _read(self, after: str, block_ms: int | None) -> list[tuple[str, dict[str, str] | None]]:
        """Outbox entries after ``after`` ('>' = new ones), as (id, fields; None for one deleted meanwhile)."""
        reply = self._redis.xreadgroup(
            WEBHOOK_GROUP, WEBHOOK_CONSUMER, {self._keys.webhooks: after}, count=READ_COUNT, block=block_ms
        )
        messages = by_stream(reply).get(self._keys.webhooks, [])
        return [(str(entry_id), fields) for entry_id, fields in messages]

    def _hold(self, entries: list[tuple[str, dict[str, str] | None]]) -> None:
        for outbox_id, fields in entries:
            entry = OutboxEntry.parse(outbox_id, fields)
            if entry is None:  # deleted after it was read, or not an outbox entry: nothing to deliver
                pipe = self._redis.pipeline()
                pipe.xack(self._keys.webhooks, WEBHOOK_GROUP, outbox_id)
                pipe.xdel(self._keys.webhooks, outbox_id)
                pipe.execute()
            else:
                self._queue.add(entry)

    def _record(self, entry: OutboxEntry, outcome: Outcome) -> None:
        """What became of an attempt, in Redis (``webhook_outcome.lua``)."""
        detail = ""
        if outcome.kind == "dropped":
            detail = outcome.problem
        elif outcome.kind == "failed":
            detail = attempt_record(entry.event_id, outcome.failed_attempts)
        self._outcome(
            keys=[self._keys.webhooks, self._keys.request(entry.request_id), self._keys.metrics],
            args=[WEBHOOK_GROUP, entry.outbox_id, outcome.kind, detail],
        )

    # --- deliveries --------------------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        ready, superseded = self._queue.take(self._clock(), self._settings.webhook_concurrency - len(self._futures))
        for entry in superseded:
            self._record(entry, Outcome("superseded", 0))  # a later event of its request says more
        for pending in ready:
            self._futures[self._pool.submit(self._deliver, pending)] = pending

    def _collect(self, *, leading: bool) -> None:
        """Record the outcome of every finished delivery; a failed one waits for its retry (while leading)."""
        for future in [future for future in self._futures if future.done()]:
            pending = self._futures.pop(future)
            entry = pending.entry
            try:
                outcome = future.result()
            except Exception as exc:  # noqa: BLE001 - a bug in one delivery must not stop the others
                log.exception("webhook delivery of %s crashed", entry.outbox_id)
                outcome = Outcome("failed", pending.failed + 1, f"{type(exc).__name__}: {exc}")
            if outcome.kind == "failed":
                delay = self._queue.failed(entry, self._clock(), outcome.failed_attempts)
                if delay is None:
                    outcome = Outcome(
                        "dropped",
                        outcome.failed_attempts,
                        f"{webhook_event(entry.event)} event {entry.event_id}: {outcome.problem} "
                        f"(after {outcome.failed_attempts} attempts)",
                    )
                    log.warning("webhook of request %s dropped: %s", entry.request_id, outcome.problem)
                else:
                    log.info(
                        "webhook %s of request %s failed (%s), attempt %d of %d; retrying in %.1f s",
                        webhook_event(entry.event),
                        entry.request_id,
                        outcome.problem,
                        outcome.failed_attempts,
                        self._queue.max_attempts,
                        delay,
                    )
            else:
                self._queue.done(entry)
                if outcome.kind == "dropped":
                    log.warning("webhook of request %s dropped: %s", entry.request_id, outcome.problem)
            self._record(entry, outcome)
        if not leading:
            self._queue.clear_waiting()

    def _deliver(self, pending: Pending) -> Outcome:
        """One attempt at ``pending`` (in a pool thread): see the module docstring."""
        entry = pending.entry
        fields = (URL_FIELD, ATTEMPT_FIELD, *STATE_FIELDS)
        values = self._redis.hmget(self._keys.request(entry.request_id), fields)
        raw = {name: str(value) for name, value in zip(fields, values, strict=True) if value is not None}
        event = webhook_event(entry.event)
        what = f"{event} event {entry.event_id}"
        if URL_FIELD not in raw or "spec" not in raw:
            return Outcome("dropped", pending.failed, f"{what}: the request is gone")
        failed = max(pending.failed, failed_attempts(raw.get(ATTEMPT_FIELD, ""), entry.event_id))
        if self._secret is None or self._rules.off:
            return Outcome("dropped", failed, f"{what}: webhooks are off on this fleet (webhook_allowed_hosts)")
        try:
            url = parse_url(raw[URL_FIELD])
            address = self._rules.check_host(url)
            if address is None:  # a name: checked where it resolves to, and connected to there
                address = self._rules.check_addresses(url, self._resolve(url.host, url.port))
        except WebhookRefused as exc:
            return Outcome("dropped", failed, f"{what}: {exc}")
        except OSError as exc:  # the resolver failed: perhaps for now
            return Outcome("failed", failed + 1, f"host {url.host} could not be resolved ({exc})")
        timestamp = int(self._wall_clock())
        body = envelope(event, entry.request_id, entry.event_id, timestamp, event_data(entry, raw))
        target, headers, extensions = pinned_request(url, address)
        headers |= {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: signature_header(self._secret, timestamp, body),
        }
        try:
            with self._http.stream("POST", target, content=body, headers=headers, extensions=extensions) as response:
                status = response.status_code  # the answer's body is never read
        except httpx.HTTPError as exc:
            return Outcome("failed", failed + 1, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        if 200 <= status < 300:
            return Outcome("delivered", failed)
        return Outcome("failed", failed + 1, f"HTTP {status}")
