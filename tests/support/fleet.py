"""A fleet of real ``fusefleet`` processes (api, scheduler, workers) under its own key prefix and queue.

Shared by tests/integration (tiny demo model) and tests/chaos (placeholder runners, faults): ``Fleet`` holds the
services plus helpers to talk to them; ``running_fleet`` starts one and always stops every process it started;
``fleet_fixture`` is a module's ``fleet`` fixture, one such fleet for all its tests.

A fleet keeps its state on the Redis it is given, or on a Redis Cluster: ``running_fleet(cluster_url=...)`` for
one fleet (tests/integration/test_cluster.py), ``run_on_cluster(url)`` for every fleet after it
(``pytest --redis-cluster``, tests/conftest.py). On a cluster the Redis the test gave becomes the fleet's Celery
broker (unless it names one) and ``Fleet.redis`` is a cluster client.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis
from redis.cluster import RedisCluster

from shared.keys import RedisKeys
from tests.support.broker import drop_queue
from tests.support.processes import Service, wait_for
from tests.support.redis_server import RedisServer, free_port

TERMINAL = {"succeeded", "failed", "aborted"}

_cluster_url: str | None = None
"""The Redis Cluster every fleet runs on when no test says otherwise (``run_on_cluster``); None: the given Redis."""


def run_on_cluster(url: str | None) -> None:
    """Run every fleet started from now on on the Redis Cluster seeded at ``url`` (None: back to the given Redis)."""
    global _cluster_url
    _cluster_url = url


def fleet_client(url: str, *, cluster: bool, **options: Any) -> redis.Redis:
    """A client (string replies) of a fleet's Redis at ``url``: a cluster client when ``cluster`` (typed as the
    plain one, as ``shared.redis_conn`` does: a fleet's keys share one slot)."""
    if cluster:
        return cast(redis.Redis, RedisCluster.from_url(url, decode_responses=True, **options))
    return redis.Redis.from_url(url, decode_responses=True, **options)


def new_prefix(kind: str = "test") -> str:
    """A key prefix (and queue name stem) no other test uses."""
    return f"ff-{kind}-{uuid.uuid4().hex[:8]}"


class Fleet:
    """The running services plus helpers to talk to them.

    ``services`` lists every process this fleet started (including later schedulers and workers); ``stop()``
    stops all of them.
    """

    def __init__(
        self,
        env: Mapping[str, str],
        log_dir: Path,
        redis_url: str,
        prefix: str,
        workers: int = 1,
        *,
        redis_socket_timeout_s: float | None = None,
    ) -> None:
        self.env = dict(env)
        self.log_dir = log_dir
        self.prefix = prefix
        self.redis = fleet_client(
            redis_url,
            cluster=self.env.get("FUSEFLEET_REDIS_CLUSTER") == "true",
            socket_timeout=redis_socket_timeout_s,
            socket_connect_timeout=5,
        )
        self.keys = RedisKeys(prefix)
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.services: list[Service] = []
        self.api = self._register(Service.fusefleet("api", ["api", "--port", str(port)], self.env, log_dir))
        self.scheduler = self.new_scheduler("scheduler")
        self.workers = [self.new_worker(f"worker{i}") for i in range(workers)]
        self.http = httpx.Client(base_url=self.base_url, timeout=30)

    def _register(self, service: Service) -> Service:
        self.services.append(service)
        return service

    def new_scheduler(self, name: str) -> Service:
        """A scheduler process (not started)."""
        return self._register(Service.fusefleet(name, ["scheduler"], self.env, self.log_dir))

    def new_worker(self, name: str, **env: str) -> Service:
        """A worker process named ``name@prefix`` (not started, not in ``workers``); ``env`` overrides."""
        worker_env = {**self.env, "FUSEFLEET_WORKER_NAME": f"{name}@{self.prefix}", **env}
        return self._register(Service.fusefleet(name, ["worker"], worker_env, self.log_dir))

    def add_worker(self, name: str, timeout: float = 120, **env: str) -> Service:
        """Start one more worker and wait until it announces itself."""
        worker = self.new_worker(name, **env).start()
        self.workers.append(worker)
        node = worker.env["FUSEFLEET_WORKER_NAME"]
        wait_for(
            lambda: self.redis.zscore(self.keys.workers, node) is not None,
            timeout,
            f"worker {node} to beat (log: {worker.log_path})",
        )
        return worker

    def start(self, timeout: float = 180) -> Fleet:
        for worker in self.workers:
            worker.start()
        self.api.start()
        self.scheduler.start()
        wait_for(self._api_up, 60, f"the api (log: {self.api.log_path})")
        wait_for(
            lambda: self.redis.zcard(self.keys.workers) >= len(self.workers),
            timeout,
            f"workers (logs in {self.log_dir})",
        )
        return self

    def worker_named(self, name: str) -> Service:
        return next(w for w in self.workers if w.env["FUSEFLEET_WORKER_NAME"] == name)

    def _api_up(self) -> bool:
        try:
            return self.http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, timeout: float = 20.0) -> None:
        self.http.close()
        for service in self.services:
            service.stop(timeout)
        self.redis.close()

    def logs_hint(self) -> str:
        return "service logs: " + ", ".join(str(s.log_path) for s in self.services)

    def log_excerpt(self, pattern: str, last: int = 40) -> str:
        """The last ``last`` lines of every service's log that match ``pattern`` (a regex), each named by its
        service's log file: what a failed assertion about timing prints, since CI keeps no log files."""
        found = re.compile(pattern)
        lines: list[str] = []
        for service in self.services:
            name = Path(service.log_path).name
            lines += [f"{name}: {line[:300]}" for line in service.log().splitlines() if found.search(line)][-last:]
        return "\n".join(lines)

    # --- API helpers ---------------------------------------------------------------------------------------
    def submit(self, **params: Any) -> str:
        body = {"prompt": "a red fox", "width": 64, "height": 64, "num_inference_steps": 4, **params}
        response = self.http.post("/v1/requests", json=body)
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def submit_batch(self, bodies: list[dict[str, Any]]) -> list[str]:
        """Submit ``bodies`` (at most 256) in one ``POST /v1/requests/batch``; their ids in order."""
        response = self.http.post("/v1/requests/batch", json={"requests": bodies})
        assert response.status_code == 202, response.text
        return [str(rid) for rid in response.json()["ids"]]

    def get(self, request_id: str) -> dict[str, Any]:
        response = self.http.get(f"/v1/requests/{request_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait_done(self, ids: list[str], timeout: float = 120) -> dict[str, dict[str, Any]]:
        states: dict[str, dict[str, Any]] = {}

        def all_done() -> bool:
            for rid in ids:
                if states.get(rid, {}).get("status") not in TERMINAL:
                    states[rid] = self.get(rid)
            return all(state["status"] in TERMINAL for state in states.values()) and len(states) == len(ids)

        wait_for(all_done, timeout, f"{len(ids)} requests to finish (logs in {self.log_dir})", interval=0.1)
        return states

    def wait_running(self, request_id: str, min_step: int, timeout: float = 60) -> dict[str, Any]:
        """Wait until the request reports step ``min_step``; fail at once if it ends instead."""

        def progressed() -> dict[str, Any] | None:
            state = self.get(request_id)
            assert state["status"] not in TERMINAL, f"request ended before running: {state}"
            return state if state["progress"]["step"] >= min_step else None

        state = wait_for(progressed, timeout, f"request {request_id} to reach step {min_step}")
        assert isinstance(state, dict)
        return state

    def image(self, request_id: str, index: int = 0) -> bytes:
        response = self.http.get(f"/v1/requests/{request_id}/images/{index}")
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "image/png"
        return response.content


def base_env(redis_url: str, prefix: str, *, cluster_url: str | None = None) -> dict[str, str]:
    """Wiring every fleet needs: its Redis, its own key prefix and its own Celery queue. With a cluster
    (``cluster_url``, else ``run_on_cluster``'s) the state lives there and ``redis_url`` is the Celery broker."""
    cluster_url = cluster_url or _cluster_url
    wiring = {"FUSEFLEET_KEY_PREFIX": prefix, "FUSEFLEET_QUEUE_NAME": f"{prefix}.batches"}
    if cluster_url is None:
        return {"FUSEFLEET_REDIS_URL": redis_url, **wiring}
    return {
        "FUSEFLEET_REDIS_URL": cluster_url,
        "FUSEFLEET_REDIS_CLUSTER": "true",
        "FUSEFLEET_BROKER_URL": redis_url,
        **wiring,
    }


@contextmanager
def running_fleet(
    redis_url: str,
    log_dir: Path,
    env: Mapping[str, str],
    *,
    prefix: str | None = None,
    workers: int = 1,
    redis_socket_timeout_s: float | None = None,
    start_timeout: float = 180,
    stop_timeout: float = 20.0,
    broker_url: str | None = None,
    cluster_url: str | None = None,
) -> Iterator[Fleet]:
    """A started fleet under ``prefix`` (fresh by default); ``env`` is added to the wiring. Always stopped.
    ``broker_url``: the Celery broker (``tests/support/broker.py``) instead of the fleet's Redis; the fleet's queue
    there is dropped once the fleet has stopped. ``cluster_url``: its state on that Redis Cluster (``base_env``)."""
    prefix = prefix or new_prefix()
    wiring = base_env(redis_url, prefix, cluster_url=cluster_url)
    full_env = {**wiring, **({"FUSEFLEET_BROKER_URL": broker_url} if broker_url else {}), **env}
    fleet = Fleet(
        full_env,
        log_dir,
        wiring["FUSEFLEET_REDIS_URL"],
        prefix,
        workers=workers,
        redis_socket_timeout_s=redis_socket_timeout_s,
    )
    try:
        yield fleet.start(start_timeout)
    finally:
        fleet.stop(stop_timeout)
        if broker_url:
            drop_queue(broker_url, full_env["FUSEFLEET_QUEUE_NAME"])


def fleet_fixture(env: Mapping[str, str], logs: str) -> Callable[..., Iterator[Fleet]]:
    """A module's ``fleet`` fixture (``fleet = fleet_fixture(ENV, "name-fleet")``): one fleet with ``env`` on the
    session's ``redis_server``, its logs in a fresh folder named ``logs``, up for all the module's tests."""

    @pytest.fixture(scope="module")
    def fleet(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
        with running_fleet(redis_server.url, tmp_path_factory.mktemp(logs), env) as one:
            yield one

    return fleet
