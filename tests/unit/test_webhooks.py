"""Webhooks without a network: the contract (subscriptions, signature, retry schedule), the allowed-hosts rules,
the api's 422s and what it stores, the outbox lines of the Lua scripts (fakeredis), the dispatcher's queue, and
the dispatcher itself against fakeredis and an in-process receiver (httpx.MockTransport)."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import fakeredis
import httpx
import pytest

from gpu_worker.store import WorkerStore
from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from scheduler.webhook_queue import DeliveryQueue
from scheduler.webhooks import WebhookDispatcher, resolve_host
from shared.contracts import BatchMessage, RequestSpec
from shared.keys import RedisKeys
from shared.metrics import parse_counters
from shared.settings import Settings
from shared.webhook_hosts import HostRules, WebhookRefused, parse_url
from shared.webhooks import (
    MAX_RETRY_DELAY_S,
    SIGNATURE_HEADER,
    OutboxEntry,
    attempt_record,
    envelope,
    failed_attempts,
    retry_delay_s,
    signature_header,
    subscription,
    verify,
    webhook_event,
)
from tests.support.api import Api, api_harness, unit_settings

SECRET = "s3cret"
HOOK = "http://127.0.0.1:9/hook"


# --- the contract ----------------------------------------------------------------------------------------------
def test_subscriptions_name_the_stream_events_the_scripts_match() -> None:
    assert subscription(None) == " aborted failed succeeded "
    assert subscription(["start", "completed"]) == " running aborted failed succeeded "
    assert subscription(["progress", "progress"]) == " progress "
    assert [webhook_event(name) for name in ("running", "progress", "failed")] == ["start", "progress", "completed"]
    with pytest.raises(ValueError):
        webhook_event("queued")


def test_signature_is_hmac_sha256_of_timestamp_dot_body_and_verifies() -> None:
    body = envelope("completed", "r1", "1700000000000-0", 1700000000, {"id": "r1", "status": "succeeded"})
    assert json.loads(body) == {
        "event": "completed",
        "request_id": "r1",
        "event_id": "1700000000000-0",
        "timestamp": 1700000000,
        "data": {"id": "r1", "status": "succeeded"},
    }
    header = signature_header(SECRET, 1700000000, body)
    expected = hmac.new(SECRET.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={expected}"
    assert verify(SECRET, header, body, now=1700000100)
    assert verify(SECRET, f"t=1700000000,v1={'0' * 64},v1={expected}", body, now=1700000000)  # a rotated key too
    assert not verify(SECRET, header, body + b" ", now=1700000100)  # body changed
    assert not verify("other", header, body, now=1700000100)  # wrong secret
    assert not verify(SECRET, header, body, now=1700000000 + 301)  # too old: a replay
    assert not verify(SECRET, header.replace("t=1700000000", "t=1700000001"), body, now=1700000000)
    assert not verify(SECRET, "v1=abc", body, now=1700000000)


def test_the_attempt_record_counts_the_failed_attempts_of_its_own_event_only() -> None:
    record = attempt_record("1700000000000-3", 2)
    assert record == "1700000000000-3 2"  # what webhook_outcome.lua stores in webhook_attempt
    assert failed_attempts(record, "1700000000000-3") == 2
    assert failed_attempts(record, "1700000000000-4") == 0  # a later event starts again
    assert failed_attempts("", "1700000000000-3") == failed_attempts("1700000000000-3 x", "1700000000000-3") == 0


def test_an_outbox_entry_is_parsed_with_its_event_fields_or_not_at_all() -> None:
    raw = {"id": "r1", "event": "progress", "entry": "5-0", "step": "3", "total": "8"}
    assert OutboxEntry.parse("9-0", raw) == OutboxEntry("9-0", "r1", "progress", "5-0", {"step": "3", "total": "8"})
    assert OutboxEntry.parse("9-0", None) is None  # deleted after it was read
    assert OutboxEntry.parse("9-0", {"id": "r1", "event": "running"}) is None  # no entry id: not an outbox entry


def test_retry_delays_double_from_the_initial_wait_up_to_a_cap() -> None:
    assert [retry_delay_s(failed, 2.0) for failed in range(1, 9)] == [2, 4, 8, 16, 32, 64, 128, 256]
    assert retry_delay_s(10, 2.0) == retry_delay_s(100, 2.0) == MAX_RETRY_DELAY_S


# --- allowed hosts ---------------------------------------------------------------------------------------------
def _allowed(rules: HostRules, url: str, addresses: Sequence[str] = ()) -> bool:
    try:
        parsed = parse_url(url)
        if rules.check_host(parsed) is None:
            rules.check_addresses(parsed, addresses)
    except WebhookRefused:
        return False
    return True


def test_an_ip_literal_is_checked_with_its_host_and_is_the_address_to_connect_to() -> None:
    rules = HostRules.parse(["*"])
    assert rules.check_host(parse_url("http://[::ffff:93.184.216.34]:8080/x")) == ipaddress.ip_address("93.184.216.34")
    assert rules.check_host(parse_url("https://hooks.example.com/")) is None  # a name: its addresses come next
    with pytest.raises(WebhookRefused, match="internal"):
        rules.check_host(parse_url("http://10.0.0.1/"))


def test_host_rules_names_subdomains_any_and_networks() -> None:
    rules = HostRules.parse(["hooks.example.com", "*.corp.example", "10.1.0.0/16", "::1"])
    public = ["93.184.216.34"]
    assert _allowed(rules, "https://HOOKS.example.com./x", public)
    assert _allowed(rules, "http://a.b.corp.example:8080/x", public)
    assert not _allowed(rules, "https://corp.example/x", public)  # the apex is not a sub-domain
    assert not _allowed(rules, "https://evil-hooks.example.com/x", public)
    assert not _allowed(rules, "https://hooks.example.com.evil.net/x", public)
    assert _allowed(rules, "http://10.1.2.3/x")  # a listed network: internal, allowed explicitly
    assert not _allowed(rules, "http://10.2.0.1/x")
    assert _allowed(rules, "http://[::1]:8000/x")
    assert not _allowed(rules, "http://127.0.0.1/x")
    everything = HostRules.parse(["*"])
    assert _allowed(everything, "https://anything.example.net/", public)
    assert _allowed(everything, "https://93.184.216.34/")


@pytest.mark.parametrize(
    "addresses",
    [
        ["127.0.0.1"],
        ["10.0.0.5"],
        ["192.168.1.1"],
        ["169.254.169.254"],  # link-local: the cloud metadata service
        ["100.64.0.1"],  # shared (carrier-grade NAT)
        ["::1"],
        ["fe80::1%eth0"],
        ["fd00::1"],
        ["::ffff:10.0.0.1"],  # an IPv4-mapped private address
        ["224.0.0.1"],
        ["93.184.216.34", "10.0.0.5"],  # one internal address among public ones is enough
        [],
    ],
)
def test_internal_or_missing_addresses_are_refused_unless_listed(addresses: list[str]) -> None:
    rules = HostRules.parse(["hooks.example.com", "*"])
    assert not _allowed(rules, "https://hooks.example.com/", addresses)
    literal = addresses[-1].split("%")[0] if addresses else None
    if literal and ":" not in literal:
        assert not _allowed(rules, f"http://{literal}/")
    if addresses:
        listed = HostRules.parse(["hooks.example.com", "0.0.0.0/0", "::/0"])
        assert _allowed(listed, "https://hooks.example.com/", addresses)


TRANSITION_FORMS = [
    # (address, allowed with "*", what the refusal names)
    ("64:ff9b::a00:1", False, "a NAT64 address of 10.0.0.1"),  # NAT64 (RFC 6052) of a private address
    ("64:ff9b::7f00:1", False, "a NAT64 address of 127.0.0.1"),
    ("64:ff9b::a9fe:a9fe", False, "a NAT64 address of 169.254.169.254"),  # the metadata service through NAT64
    ("64:ff9b::808:808", True, ""),  # NAT64 of a public address: the gateway reaches 8.8.8.8
    ("64:ff9b:1::a00:1", False, "local-use NAT64"),
    ("64:ff9b:1::808:808", False, "local-use NAT64"),
    ("2002:a00:1::1", False, "6to4"),  # 6to4 of 10.0.0.1
    ("2002:808:808::1", False, "6to4"),  # of a public address: where it leads depends on relays
    ("::10.0.0.1", False, "IPv4-compatible"),
    ("::8.8.8.8", False, "IPv4-compatible"),
    ("::ffff:10.0.0.1", False, "10.0.0.1, an internal address"),  # IPv4-mapped: that address
    ("::ffff:8.8.8.8", True, ""),
    ("::ffff:0:a00:1", False, "IPv4-translated"),
    ("2001::1", False, "Teredo"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False, "Teredo"),
    ("fec0::1", False, "site-local"),
    ("192.88.99.1", False, "6to4 relay anycast"),
    ("::1", False, "loopback"),
    ("::", False, "unspecified"),
    ("2001:4860:4860::8888", True, ""),  # plain public IPv6
]


@pytest.mark.parametrize(("address", "allowed", "named"), TRANSITION_FORMS)
def test_ipv6_transition_forms_are_judged_by_the_ipv4_they_embed_or_refused(
    address: str, allowed: bool, named: str
) -> None:
    rules = HostRules.parse(["*"])
    url = parse_url(f"http://[{address}]/" if ":" in address else f"http://{address}/")
    for check in (
        lambda: rules.check_host(url),
        lambda: rules.check_addresses(parse_url("https://h.example/"), [address]),
    ):
        if allowed:
            check()
        else:
            with pytest.raises(WebhookRefused, match=re.escape(named)):
                check()
    # a listed network still makes any of them reachable: as given (an IPv4-mapped one as its IPv4 address), or
    # (NAT64) the IPv4 network it reaches
    listed = address.removeprefix("::ffff:") if address.count(".") == 3 else address
    assert _allowed(HostRules.parse(["*", listed]), "https://h.example/", [address])
    if address.startswith("64:ff9b::"):
        assert _allowed(HostRules.parse(["*", "10.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16"]), url.url)


def test_no_entries_means_off_and_bad_entries_or_urls_are_named() -> None:
    with pytest.raises(WebhookRefused, match="webhooks are off"):
        HostRules.parse([]).check_host(parse_url("https://hooks.example.com/"))
    for entry in ("not a host", "*.", "10.0.0.0/33", "a..b"):
        with pytest.raises(ValueError, match="webhook_allowed_hosts"):
            HostRules.parse([entry])
    for url, problem in [
        ("ftp://hooks.example.com/", "http:// or https://"),
        ("https://user:pw@hooks.example.com/", "user info"),
        ("https:///path", "names a host"),
        ("https://hooks.example.com:99999/", "not a valid URL"),
    ]:
        with pytest.raises(WebhookRefused, match=problem):
            parse_url(url)


def test_settings_need_a_secret_with_hosts_and_read_a_comma_list(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="needs webhook_secret"):
        Settings(webhook_allowed_hosts=["hooks.example.com"])
    monkeypatch.setenv("FUSEFLEET_WEBHOOK_ALLOWED_HOSTS", " hooks.example.com, 10.0.0.0/8 ")
    monkeypatch.setenv("FUSEFLEET_WEBHOOK_SECRET", SECRET)
    settings = Settings()
    assert settings.webhook_allowed_hosts == ["hooks.example.com", "10.0.0.0/8"]
    assert settings.webhook_rules.names == {"hooks.example.com"}
    monkeypatch.setenv("FUSEFLEET_WEBHOOK_ALLOWED_HOSTS", '["*"]')
    assert Settings().webhook_rules.any_host


# --- the api ---------------------------------------------------------------------------------------------------
def webhook_settings(tmp_path: Path, hosts: Sequence[str] = ("127.0.0.1",), **overrides: Any) -> Settings:
    return unit_settings(
        tmp_path, webhook_allowed_hosts=list(hosts), webhook_secret=SECRET, max_queue_len=50, **overrides
    )


@pytest.fixture
async def hooked(tmp_path: Path) -> AsyncIterator[Api]:
    async for harness in api_harness(webhook_settings(tmp_path, ["127.0.0.1"])):
        yield harness


def _errors(response: httpx.Response) -> list[tuple[list[Any], str]]:
    assert response.status_code == 422, response.text
    return [(error["loc"], error["msg"]) for error in response.json()["detail"]]


@pytest.mark.anyio
async def test_webhooks_are_refused_while_off(api: Api) -> None:
    response = await api.http.post("/v1/requests", json={"prompt": "a cat", "webhook": HOOK})
    assert _errors(response) == [
        (["body", "webhook"], "webhooks are off on this server (its webhook_allowed_hosts is empty)")
    ]
    schema = (await api.http.get("/openapi.json")).json()["components"]["schemas"]["GenerateRequest"]
    assert schema["properties"]["webhook"]["type"] == schema["properties"]["webhook_events"]["type"] == "null"


@pytest.mark.anyio
async def test_a_refused_webhook_is_a_422_naming_the_field(hooked: Api) -> None:
    cases: list[tuple[dict[str, Any], list[Any], str]] = [
        ({"webhook": "http://10.0.0.1/hook"}, ["body", "webhook"], "10.0.0.1 is not in this server's"),
        ({"webhook": "https://hooks.example.com/"}, ["body", "webhook"], "host hooks.example.com is not allowed"),
        ({"webhook": "gopher://127.0.0.1/"}, ["body", "webhook"], "http:// or https://"),
        ({"webhook_events": ["completed"]}, ["body", "webhook_events"], "webhook_events needs a webhook"),
        ({"webhook": HOOK, "webhook_events": ["done"]}, ["body", "webhook_events", 0], "Input should be"),
        ({"webhook": HOOK, "webhook_events": []}, ["body", "webhook_events"], "at least 1 item"),
    ]
    for body, loc, message in cases:
        response = await hooked.http.post("/v1/requests", json={"prompt": "a cat", **body})
        ((error_loc, error_message),) = _errors(response)
        assert error_loc == loc and message in error_message, (body, error_loc, error_message)
    assert await hooked.redis.xlen(hooked.keys.requests) == 0  # nothing was queued
    batch = [{"prompt": "ok", "webhook": HOOK}, {"prompt": "no", "webhook": "http://10.9.9.9/"}]
    response = await hooked.http.post("/v1/requests/batch", json={"requests": batch})
    assert [loc for loc, _ in _errors(response)] == [["body", "requests", 1, "webhook"]]


@pytest.mark.anyio
async def test_an_allowed_name_resolving_to_an_internal_address_is_refused(tmp_path: Path) -> None:
    async for harness in api_harness(webhook_settings(tmp_path, ["localhost"])):  # by name, its address unlisted
        response = await harness.http.post("/v1/requests", json={"prompt": "a cat", "webhook": "http://localhost/"})
        ((loc, message),) = _errors(response)
        assert loc == ["body", "webhook"] and "an internal address" in message


@pytest.mark.anyio
async def test_an_accepted_webhook_is_stored_beside_the_spec_not_in_it(hooked: Api) -> None:
    body = {"prompt": "a cat", "webhook": HOOK, "webhook_events": ["start", "completed"]}
    request_id = (await hooked.http.post("/v1/requests", json=body)).json()["id"]
    plain_id = (await hooked.http.post("/v1/requests", json={"prompt": "a cat"})).json()["id"]
    stored = await hooked.redis.hgetall(hooked.keys.request(request_id))
    assert stored["webhook"] == HOOK and stored["webhook_on"] == " running aborted failed succeeded "
    assert "webhook" not in RequestSpec.model_validate_json(stored["spec"]).model_dump()  # not in the batching key
    plain = await hooked.redis.hgetall(hooked.keys.request(plain_id))
    assert "webhook" not in plain and "webhook_on" not in plain


# --- the Lua scripts' outbox lines -----------------------------------------------------------------------------
def _outbox(client: fakeredis.FakeRedis, keys: RedisKeys) -> list[tuple[str, str, dict[str, str]]]:
    """(request id, event, other fields) of every outbox entry, in order; ``entry`` checked against the stream."""
    out = []
    for _, fields in client.xrange(keys.webhooks):
        request_id, event, entry = fields.pop("id"), fields.pop("event"), fields.pop("entry")
        ((_, recorded),) = client.xrange(keys.request_events(request_id), entry, entry)
        assert recorded["event"] == event  # the entry is the very event of the request's stream
        out.append((request_id, event, fields))
    return out


@pytest.mark.anyio
async def test_the_scripts_write_the_outbox_only_for_subscribed_events_of_webhook_requests(hooked: Api) -> None:
    async def submit(**body: Any) -> str:
        response = await hooked.http.post("/v1/requests", json={"prompt": "a cat", **body})
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    every = await submit(webhook=HOOK, webhook_events=["start", "progress", "completed"])
    default = await submit(webhook=HOOK)
    plain = await submit()
    aborted = await submit(webhook=HOOK)
    failed = await submit(webhook=HOOK)
    client = fakeredis.FakeRedis(server=hooked.server, decode_responses=True)
    settings, keys = hooked.settings, hooked.keys
    assert await hooked.http.post(f"/v1/requests/{aborted}/abort") is not None
    scheduler = SchedulerStore(client, settings)
    lease = Lease(client, keys.scheduler_lease, 5000)
    assert lease.try_acquire()
    scheduler.schedule(lease.key, lease.token, "B1", [every, default, plain])
    worker = WorkerStore(client, settings)
    worker.claim(BatchMessage(batch_id="B1", request_ids=(every, default, plain), created_at=0.0), "tok", "w1")
    for step, pause in ((1, 0.3), (2, 0.3), (3, 0.0), (4, 0.0)):
        time.sleep(pause)  # past the event stream's 250 ms throttle, within the webhook's second
        worker.progress([every, default, plain], step, 4, "tok")
    steps = [f["step"] for _, f in client.xrange(keys.request_events(every)) if f["event"] == "progress"]
    assert steps == ["1", "2", "4"]
    worker.finish_many({every: [], default: [], plain: []}, {}, "tok")
    scheduler.expire([failed])  # fails a queued request (Timeout)
    assert _outbox(client, keys) == [
        (aborted, "aborted", {}),
        (every, "running", {"worker": "w1"}),
        (every, "progress", {"step": "1", "total": "4"}),
        (every, "progress", {"step": "4", "total": "4"}),
        (every, "succeeded", {}),
        (default, "succeeded", {}),
        (failed, "failed", {}),
    ]
    assert all(request_id != plain for request_id, _, _ in _outbox(client, keys))


# --- the dispatcher's queue ------------------------------------------------------------------------------------
def _entry(n: int, request_id: str, event: str) -> OutboxEntry:
    return OutboxEntry(f"{n}-0", request_id, event, f"{n}-0")


def test_one_request_goes_in_order_a_retry_first_others_independently() -> None:
    queue = DeliveryQueue(max_attempts=3, retry_initial_s=1.0)
    for entry in [_entry(1, "a", "running"), _entry(2, "b", "succeeded"), _entry(3, "a", "succeeded")]:
        assert queue.add(entry)
    assert not queue.add(_entry(1, "a", "running"))  # read again: held once
    ready, _ = queue.take(now=0.0, limit=10)
    assert [p.entry.outbox_id for p in ready] == ["1-0", "2-0"]  # a's completed waits behind a's start
    assert queue.take(now=0.0, limit=10) == ([], [])
    assert queue.failed(ready[0].entry, now=0.0, failed_attempts=1) == 1.0
    queue.done(ready[1].entry)
    assert queue.next_due() == 1.0
    assert queue.take(now=0.5, limit=10) == ([], [])  # not before the retry is due, and a's completed waits
    (retry,), _ = queue.take(now=1.0, limit=10)
    assert retry.entry.outbox_id == "1-0" and retry.failed == 1
    assert queue.failed(retry.entry, now=1.0, failed_attempts=2) == 2.0
    (retry,), _ = queue.take(now=3.0, limit=10)
    assert queue.failed(retry.entry, now=3.0, failed_attempts=3) is None  # the last attempt: dropped
    (last,), _ = queue.take(now=3.0, limit=10)
    assert last.entry.outbox_id == "3-0"
    queue.done(last.entry)
    assert len(queue) == 0 and queue.next_due() is None


def test_a_waiting_progress_is_superseded_by_a_later_event_and_limits_hold() -> None:
    queue = DeliveryQueue(max_attempts=3, retry_initial_s=1.0)
    queue.add(_entry(1, "a", "running"))
    (start,), _ = queue.take(now=0.0, limit=1)
    for n, event in [(2, "progress"), (3, "progress"), (4, "progress"), (5, "succeeded")]:
        queue.add(_entry(n, "a", event))
    queue.done(start.entry)
    ready, superseded = queue.take(now=0.0, limit=1)
    assert [e.outbox_id for e in superseded] == ["2-0", "3-0", "4-0"]
    assert [p.entry.outbox_id for p in ready] == ["5-0"]
    queue.add(_entry(6, "b", "succeeded"))
    queue.add(_entry(7, "c", "succeeded"))
    assert len(queue.take(now=0.0, limit=1)[0]) == 1
    queue.clear_waiting()  # a new leader reads the outbox again; what is in flight stays held
    assert len(queue) == 2 and not queue.add(_entry(5, "a", "succeeded"))


# --- the dispatcher --------------------------------------------------------------------------------------------
class Receiver:
    """An in-process receiver: answers ``status`` to every request and keeps them."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return httpx.Response(self.status)


def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _dispatch(
    tmp_path: Path,
    hosts: list[str],
    status: int,
    resolve: Callable[[str, int], list[str]],
    *,
    client: fakeredis.FakeRedis | None = None,
    real_http: bool = False,
) -> tuple[fakeredis.FakeRedis, RedisKeys, Receiver, Callable[[], None]]:
    """A dispatcher running in a thread on ``client`` (a fresh fakeredis by default), posting to ``Receiver`` (or
    over the network with ``real_http``); the last item stops it."""
    settings = webhook_settings(
        tmp_path,
        hosts,
        webhook_max_attempts=3,
        webhook_retry_initial_s=0.01,
        webhook_timeout_s=0.3,
        scheduler_lease_ms=300,
        scheduler_block_ms=20,
    )
    client = client or fakeredis.FakeRedis(decode_responses=True)
    receiver = Receiver(status)
    http = None if real_http else httpx.Client(transport=httpx.MockTransport(receiver))
    dispatcher = WebhookDispatcher(client, settings, http=http, resolve=resolve)
    stop = threading.Event()
    thread = dispatcher.start(stop)

    def stopped() -> None:
        stop.set()
        thread.join(5)

    return client, RedisKeys(settings.key_prefix), receiver, stopped


def _terminal_request(client: fakeredis.FakeRedis, keys: RedisKeys, webhook: str) -> str:
    """A succeeded request with ``webhook`` and its outbox entry, as finish.lua leaves them."""
    spec = RequestSpec(
        id="r1", model="demo", prompt="p", seed=1, width=64, height=64, num_inference_steps=4, guidance_scale=5.0,
        created_at=time.time(),
    )  # fmt: skip
    client.hset(
        keys.request("r1"),
        mapping={"spec": spec.model_dump_json(), "status": "succeeded", "webhook": webhook, "webhook_on": " x "},
    )
    event = client.xadd(keys.request_events("r1"), {"event": "succeeded"})
    client.xadd(keys.webhooks, {"id": "r1", "event": "succeeded", "entry": event})
    return str(event)


def test_a_failing_receiver_gets_every_attempt_then_the_drop_is_recorded(tmp_path: Path) -> None:
    client, keys, receiver, stop = _dispatch(tmp_path, ["hooks.example.com"], 503, lambda host, port: ["93.184.216.34"])
    try:
        event_id = _terminal_request(client, keys, "https://hooks.example.com/in?x=1")
        _until(lambda: client.hget(keys.request("r1"), "webhook_error") is not None)
    finally:
        stop()
    assert len(receiver.requests) == 3  # webhook_max_attempts
    request = receiver.requests[0]
    assert str(request.url) == "https://93.184.216.34/in?x=1"  # the checked address, not a new lookup
    assert request.headers["host"] == "hooks.example.com"
    assert request.extensions["sni_hostname"] == "hooks.example.com"  # TLS checks the name's certificate
    for attempt in receiver.requests:
        assert verify(SECRET, attempt.headers[SIGNATURE_HEADER], attempt.content, now=time.time())
        assert json.loads(attempt.content)["event_id"] == event_id
    error = client.hget(keys.request("r1"), "webhook_error")
    assert error == f"completed event {event_id}: HTTP 503 (after 3 attempts)"
    assert client.xlen(keys.webhooks) == 0 and not client.hexists(keys.request("r1"), "webhook_attempt")
    assert client.hmget(keys.metrics, "webhooks:retried", "webhooks:dropped") == ["2", "1"]


def test_a_host_that_now_resolves_internally_is_dropped_unsent(tmp_path: Path) -> None:
    client, keys, receiver, stop = _dispatch(tmp_path, ["hooks.example.com"], 200, lambda host, port: ["10.0.0.7"])
    try:
        _terminal_request(client, keys, "https://hooks.example.com/in")
        _until(lambda: client.hget(keys.request("r1"), "webhook_error") is not None)
    finally:
        stop()
    assert receiver.requests == []
    assert "10.0.0.7, an internal address" in str(client.hget(keys.request("r1"), "webhook_error"))


def test_outcome_counters_reach_the_fleet_metrics() -> None:
    counters = parse_counters({"webhooks:delivered": "5", "webhooks:dropped": "1", "webhooks:retried": "3"})
    assert counters.webhooks == {"delivered": 5, "dropped": 1, "retried": 3, "superseded": 0}


def test_the_documented_receiver_snippet_verifies_what_the_fleet_signs() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    snippet = next(block for block in doc.split("```python")[1:] if "def verified(" in block).split("```")[0]
    namespace: dict[str, Any] = {}
    exec(snippet, namespace)  # our own documentation
    verified = namespace["verified"]
    body = envelope("start", "r1", "1-0", int(time.time()), {"id": "r1", "worker": "w"})
    header = signature_header(SECRET, int(time.time()), body)
    assert verified(SECRET, header, body)
    assert not verified(SECRET, header, body[:-1] + b" ")
    assert not verified("other", header, body)
    assert not verified(SECRET, signature_header(SECRET, int(time.time()) - 301, body), body)


def test_a_receiver_that_never_answers_fails_each_attempt_within_the_timeout(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (the kernel does), never answers
        port = silent.getsockname()[1]
        client, keys, _, stop = _dispatch(tmp_path, ["127.0.0.1"], 200, resolve_host, real_http=True)
        started = time.monotonic()
        try:
            _terminal_request(client, keys, f"http://127.0.0.1:{port}/hook")
            _until(lambda: client.hget(keys.request("r1"), "webhook_error") is not None)
        finally:
            stop()
    elapsed = time.monotonic() - started
    assert "ReadTimeout" in str(client.hget(keys.request("r1"), "webhook_error"))
    assert 3 * 0.3 <= elapsed < 3 * 0.3 + 2.0  # 3 attempts of webhook_timeout_s each, plus the short waits
    print(f"silent receiver: dropped after 3 timed-out attempts in {elapsed:.2f} s")  # docs/reliability.md (-s)


def test_a_new_dispatcher_delivers_what_a_dead_one_left_pending_and_resumes_its_count(tmp_path: Path) -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    keys = RedisKeys("t")
    event_id = _terminal_request(client, keys, "https://hooks.example.com/in")
    client.xgroup_create(keys.webhooks, "webhooks", id="0")
    client.xreadgroup("webhooks", "active", {keys.webhooks: ">"})  # read by a dispatcher that died then
    client.hset(keys.request("r1"), "webhook_attempt", f"{event_id} 2")  # after two failed attempts
    _, _, receiver, stop = _dispatch(
        tmp_path, ["hooks.example.com"], 500, lambda host, port: ["93.184.216.34"], client=client
    )
    try:
        _until(lambda: client.hget(keys.request("r1"), "webhook_error") is not None)
    finally:
        stop()
    assert len(receiver.requests) == 1  # the third and last of webhook_max_attempts
    assert "after 3 attempts" in str(client.hget(keys.request("r1"), "webhook_error"))
    assert client.xpending(keys.webhooks, "webhooks")["pending"] == 0
