"""Tools of the chaos suite: count terminal publications, fake a worker slot, submit in bulk, check invariants.

The invariant every chaos test ends with (``assert_every_request_ended_once``):

- every accepted request reached a terminal status;
- none was published terminal twice (``P:finished`` carries one message per terminal transition; with a Redis
  restart in the middle the subscription may lose messages, then "at most once" plus the status read back);
- no service process died except the ones the test killed;
- the fleet still serves a new request to success.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import redis

from shared.keys import RedisKeys
from tests.support.fleet import TERMINAL, Fleet
from tests.support.processes import Service

CHUNK = 256  # the api's largest batch submission


@dataclass(frozen=True, slots=True)
class Finish:
    """A request's state read right after its first terminal publication (None: already gone)."""

    status: str | None
    error_type: str | None
    error_message: str | None
    finished_at: str | None
    image: bytes | None = None  # image 0, when the watcher captures images

    @classmethod
    def of(cls, row: Sequence[str | None], image: bytes | None = None) -> Finish:
        """From an HMGET of ``FinishedWatcher.FIELDS``."""
        status, error_type, error_message, finished_at, _ = row
        return cls(status, error_type, error_message, finished_at, image)


class FinishedWatcher:
    """Subscribes to ``P:finished`` and counts the terminal publications of every request id.

    A background thread reads the channel and, for each id seen for the first time, reads the request's status,
    error and ``finished_at`` (and optionally image 0) at once, so short result TTLs do not hide them.
    ``drops`` counts lost subscriptions (Redis went away): messages published meanwhile are missing.
    """

    FIELDS = ("status", "error_type", "error_message", "finished_at", "results")

    def __init__(self, redis_url: str, keys: RedisKeys, *, capture_images: bool = False) -> None:
        self._url = redis_url
        self._keys = keys
        self._capture_images = capture_images
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._first: dict[str, Finish] = {}
        self._to_read: list[str] = []
        self.drops = 0
        self._subscribed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="finished-watcher", daemon=True)

    def __enter__(self) -> FinishedWatcher:
        self._thread.start()
        if not self._subscribed.wait(10):
            raise TimeoutError(f"could not subscribe to {self._keys.finished}")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    # --- what was seen -------------------------------------------------------------------------------------------
    def count(self, request_id: str) -> int:
        with self._lock:
            return self._counts[request_id]

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self._counts)

    def first(self, request_id: str) -> Finish | None:
        with self._lock:
            return self._first.get(request_id)

    def firsts(self) -> dict[str, Finish]:
        with self._lock:
            return dict(self._first)

    def unseen(self, ids: Iterable[str]) -> list[str]:
        """Ids not published terminal yet, or whose state was not read yet."""
        with self._lock:
            return [rid for rid in ids if rid not in self._first]

    def wait_all(self, ids: Sequence[str], timeout: float) -> list[str]:
        """Wait until every id was published and read (or ``timeout``); the ids still missing."""
        deadline = time.monotonic() + timeout
        missing = self.unseen(ids)
        while missing and time.monotonic() < deadline:
            time.sleep(0.1)
            missing = self.unseen(missing)
        return missing

    # --- the thread ------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        reader = redis.Redis.from_url(self._url, decode_responses=True, socket_timeout=5, socket_connect_timeout=2)
        binary = redis.Redis.from_url(self._url, socket_timeout=5, socket_connect_timeout=2)
        while not self._stop.is_set():
            client = redis.Redis.from_url(self._url, decode_responses=True, socket_connect_timeout=2)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            subscribed = False
            try:
                pubsub.subscribe(self._keys.finished)
                subscribed = True
                self._subscribed.set()
                while not self._stop.is_set():
                    self._drain(pubsub)
                    self._read_states(reader, binary)
            except Exception:  # Redis went away (or answered nonsense): count it and resubscribe
                if subscribed:
                    self.drops += 1
                self._stop.wait(0.2)
            finally:
                try:
                    pubsub.close()
                    client.close()
                except Exception:  # the connection is gone anyway
                    pass
        reader.close()
        binary.close()

    def _drain(self, pubsub: Any, most: int = 2000) -> None:
        message = pubsub.get_message(timeout=0.05)
        seen = 0
        while message is not None and seen < most:
            if message.get("type") == "message":  # one or more ids, space-separated (one per script call)
                with self._lock:
                    for request_id in str(message["data"]).split():
                        self._counts[request_id] += 1
                        if self._counts[request_id] == 1:
                            self._to_read.append(request_id)
            seen += 1
            message = pubsub.get_message(timeout=0)

    def _read_states(self, reader: redis.Redis, binary: redis.Redis) -> None:
        with self._lock:
            ids, self._to_read = self._to_read, []
        if not ids:
            return
        try:
            pipe = reader.pipeline(transaction=False)
            for rid in ids:
                pipe.hmget(self._keys.request(rid), list(self.FIELDS))
            rows = pipe.execute()
            images: list[Any] = [None] * len(ids)
            if self._capture_images:
                bpipe = binary.pipeline(transaction=False)  # image 0, from the Redis result store
                for row in rows:
                    first = (row[-1] or "").split()
                    bpipe.get(self._keys.result(first[0]) if first else "-")
                images = bpipe.execute()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            with self._lock:
                self._to_read = ids + self._to_read  # read them once Redis answers again
            return
        with self._lock:
            for rid, row, image in zip(ids, rows, images, strict=True):
                self._first[rid] = Finish.of(row, image)


class FakeWorkerHeartbeat:
    """Makes the scheduler see one live worker slot that no process serves (a member of ``P:workers``)."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, name: str, interval_s: float = 0.2) -> None:
        self._redis = client
        self._keys = keys
        self.name = name
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-heartbeat", daemon=True)

    def _beat(self) -> None:
        self._redis.zadd(self._keys.workers, {self.name: int(time.time() * 1000)})

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._beat()
            except redis.RedisError:
                pass

    def start(self) -> FakeWorkerHeartbeat:
        self._beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating and leave the worker set at once."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._redis.zrem(self._keys.workers, self.name)


def body(prompt: str = "chaos", *, width: int = 64, height: int = 64, steps: int = 4, **extra: Any) -> dict[str, Any]:
    return {"prompt": prompt, "width": width, "height": height, "num_inference_steps": steps, **extra}


def submit_all(fleet: Fleet, bodies: Sequence[dict[str, Any]], *, threads: int = 4) -> list[str]:
    """Submit ``bodies`` through ``POST /v1/requests/batch`` in chunks of 256, ``threads`` at a time; ids in order."""
    chunks = [list(bodies[i : i + CHUNK]) for i in range(0, len(bodies), CHUNK)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(fleet.submit_batch, chunks))
    return [rid for ids in results for rid in ids]


def random_bodies(count: int, rng: random.Random, shapes: Sequence[dict[str, int]]) -> list[dict[str, Any]]:
    """``count`` bodies whose size / step count (compatibility key) is drawn from ``shapes``."""
    return [body(f"soak {i}", **rng.choice(shapes)) for i in range(count)]


def redis_down_answer(fleet: Fleet, request: Callable[[httpx.Client], httpx.Response]) -> tuple[httpx.Response, float]:
    """Make ``request`` against the api and time the answer (for outage checks)."""
    started = time.monotonic()
    with httpx.Client(base_url=fleet.base_url, timeout=30) as client:
        response = request(client)
    return response, time.monotonic() - started


def statuses(fleet: Fleet, ids: Sequence[str]) -> Counter[str | None]:
    """How many of ``ids`` are in each status now (None: the request hash is gone)."""
    pipe = fleet.redis.pipeline(transaction=False)
    for rid in ids:
        pipe.hget(fleet.keys.request(rid), "status")
    return Counter(pipe.execute())


def dead_services(fleet: Fleet, killed: Iterable[Service] = ()) -> list[str]:
    """Services that were started, not stopped, and are not running any more (minus those ``killed``)."""
    skip = {id(service) for service in killed}
    return [
        f"{s.name} (exit {s.process.returncode}, log {s.log_path})"
        for s in fleet.services
        if id(s) not in skip and s.process is not None and s.process.poll() is not None
    ]


def serves_a_new_request(fleet: Fleet, timeout: float = 60.0, **params: Any) -> dict[str, Any]:
    """Submit one new request and wait (long polls) until it ends; its state."""
    rid = fleet.submit(prompt="a new request after the chaos", **params)
    deadline = time.monotonic() + timeout
    state = fleet.get(rid)
    while state["status"] not in TERMINAL and time.monotonic() < deadline:
        response = fleet.http.get(f"/v1/requests/{rid}", params={"wait_s": min(5.0, timeout)})
        if response.status_code == 200:
            state = dict(response.json())
        else:
            time.sleep(0.2)
    return state


def assert_every_request_ended_once(
    fleet: Fleet,
    watcher: FinishedWatcher,
    ids: Sequence[str],
    *,
    timeout: float,
    expect: Callable[[str, Finish], str | None] | None = None,
    killed: Iterable[Service] = (),
    new_request: dict[str, Any] | None = None,
) -> dict[str, Finish]:
    """The chaos suite's common end: every accepted request terminal, none terminal twice, no unexpected process
    death, and a new request served to success. ``expect(id, finish)`` returns a complaint or None (default: the
    request succeeded). Returns each request's state at its first terminal publication."""
    hint = fleet.logs_hint()
    read_back: dict[str, Finish] = {}
    deadline = time.monotonic() + timeout
    missing = watcher.wait_all(ids, min(timeout, 1.0))
    while missing:
        if watcher.drops:
            # the subscription dropped (Redis restarted): a publication may be lost, the stored status is not
            pipe = fleet.redis.pipeline(transaction=False)
            for rid in missing:
                pipe.hmget(fleet.keys.request(rid), list(FinishedWatcher.FIELDS))
            for rid, row in zip(missing, pipe.execute(), strict=True):
                if row[0] in TERMINAL:
                    read_back[rid] = Finish.of(row)
            missing = [rid for rid in missing if rid not in read_back]
        if not missing or time.monotonic() > deadline:
            break
        missing = watcher.wait_all(missing, min(1.0, max(0.0, deadline - time.monotonic())))
    finishes = {**read_back, **watcher.firsts()}
    missing = [rid for rid in ids if rid not in finishes]
    if missing:
        sample = {rid: fleet.redis.hgetall(fleet.keys.request(rid)) for rid in missing[:3]}
        statuses = Counter(fleet.redis.hget(fleet.keys.request(rid), "status") for rid in missing)
        raise AssertionError(
            f"{len(missing)} of {len(ids)} accepted requests never reached a terminal status within {timeout:.0f}s "
            f"(statuses now: {dict(statuses)}; e.g. {sample}); {hint}"
        )

    counts = watcher.counts()
    twice = {rid: n for rid, n in counts.items() if n > 1}
    assert not twice, f"requests published terminal more than once: {dict(list(twice.items())[:10])}; {hint}"
    if not watcher.drops:
        assert all(counts[rid] == 1 for rid in ids)

    check = expect or (lambda rid, f: None if f.status == "succeeded" else f"ended {f.status}: {f}")
    complaints = {rid: c for rid in ids if (c := check(rid, finishes[rid])) is not None}
    assert not complaints, (
        f"{len(complaints)} requests ended wrongly, e.g. {dict(list(complaints.items())[:5])}; {hint}"
    )

    dead = dead_services(fleet, killed)
    assert not dead, f"service processes died that the test did not kill: {dead}"

    state = serves_a_new_request(fleet, **(new_request or {}))
    assert state["status"] == "succeeded", f"a new request after the chaos ended {state}; {hint}"
    assert fleet.image(state["id"])
    dead = dead_services(fleet, killed)
    assert not dead, f"service processes died that the test did not kill: {dead}"
    return finishes
