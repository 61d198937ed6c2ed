"""The broker crashes (SIGKILL) with batches running and requests waiting, and comes back 3 s later on the same port
and data: no request is lost, none ends twice, no service exits. On RabbitMQ (a private node,
``tests/support/rabbitmq_server.py``), and on a plain Redis of its own (append-only, ``appendfsync always``).

Two workers run a slow batch each while quick requests wait in the scheduler for a slot. While the broker is gone
the running forwards go on and finish (their state and results are in Redis, not the broker; acknowledging their
messages fails), the scheduler's publishes fail and it stands by and leads again; the workers' Celery consumers
reconnect by themselves (kombu's backoff: 2, 4, 6 ... s, at most 30 s apart). When the broker is back it still
holds every message it confirmed: RabbitMQ gives back those it had delivered unacknowledged (their copies find
their batches done); a Redis broker keeps them in its unacked hash until the visibility timeout, long after.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Protocol

import pytest

from tests.chaos.conftest import FleetFactory, RedisFactory
from tests.support.chaos import FinishedWatcher, assert_every_request_ended_once, body
from tests.support.processes import wait_for
from tests.support.rabbitmq_server import RabbitMQServer

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

OUTAGE_S = 3.0
RECONNECT_S = 30.0  # kombu's longest wait between two reconnection attempts of a worker's consumer
SCHEDULER_BACKOFF_S = 5.0
SLOW_STEPS, QUICK = 600, 8  # a slow forward takes 6 s (10 ms a step); the quick ones wait for a slot meanwhile


class Broker(Protocol):
    url: str

    def kill(self) -> None: ...

    def start(self) -> object: ...


@pytest.mark.parametrize("kind", ["rabbitmq", "redis"])
def test_a_broker_crash_loses_no_request(
    kind: str, chaos_redis: RedisFactory, chaos_fleet: FleetFactory, chaos_stack: ExitStack, tmp_path: Path
) -> None:
    broker: Broker
    if kind == "rabbitmq":
        if not RabbitMQServer.available():
            pytest.skip("no rabbitmq-server installed (Debian's rabbitmq-server package)")
        broker = RabbitMQServer(tmp_path / "rabbitmq").start()
        chaos_stack.callback(broker.stop)
    else:
        broker = chaos_redis(persistent=True, appendfsync="always")
    server = chaos_redis()
    fleet = chaos_fleet(
        server,
        workers=2,
        FUSEFLEET_BROKER_URL=broker.url,
        FUSEFLEET_RUNNER="bench.runners:SimulatedGpuRunner",  # its forwards take time by their steps
        FUSEFLEET_SIM_BASE_MS="200",
        FUSEFLEET_SIM_REF_STEPS="20",
        FUSEFLEET_MAX_INFERENCE_STEPS="1000",
        FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS="100",
    )
    with FinishedWatcher(server.url, fleet.keys) as watcher:
        slow = fleet.submit_batch([body(f"slow {i}", steps=SLOW_STEPS) for i in range(8)])
        fleet.wait_running(slow[0], min_step=3)
        fleet.wait_running(slow[-1], min_step=3)  # both workers busy
        quick = fleet.submit_batch([body(f"quick {i}") for i in range(QUICK)])
        broker.kill()
        killed = time.time()
        time.sleep(OUTAGE_S)
        broker.start()
        back = time.time()
        ids = slow + quick
        bound_s = RECONNECT_S + SCHEDULER_BACKOFF_S + 2 * SLOW_STEPS / 100
        finishes = assert_every_request_ended_once(fleet, watcher, ids, timeout=bound_s + 30)
    took_s = max(float(f.finished_at or 0) for f in finishes.values()) - back
    slow_done = max(float(finishes[rid].finished_at or 0) for rid in slow)
    print(
        f"\n{kind} broker killed {OUTAGE_S:.0f} s with 2 batches running and {QUICK} waiting: all {len(ids)} ended "
        f"once, the last {took_s:.1f} s after the broker was back ({back - killed:.1f} s after the kill; the running "
        f"batches ended {slow_done - killed:.1f} s after the kill)"
    )
    assert took_s <= bound_s, f"took {took_s:.1f} s after the broker came back, over {bound_s:.0f} s"


def test_a_broker_that_blocks_publishers_delays_requests_and_hangs_nothing(
    chaos_redis: RedisFactory, chaos_fleet: FleetFactory, chaos_stack: ExitStack, tmp_path: Path
) -> None:
    """A RabbitMQ memory alarm blocks every publishing connection (it stops reading them) until it clears. The
    scheduler's publish fails within its bound (write and confirm timeouts, ``redis_socket_timeout_s``, 2 s here;
    Celery's 3 retries) instead of hanging: it stands by, leads again and publishes the batch again once the
    broker reads again; the requests then run, each once."""
    if not RabbitMQServer.available():
        pytest.skip("no rabbitmq-server installed (Debian's rabbitmq-server package)")
    broker = RabbitMQServer(tmp_path / "rabbitmq").start()
    chaos_stack.callback(broker.stop)
    server = chaos_redis()
    fleet = chaos_fleet(server, workers=1, FUSEFLEET_BROKER_URL=broker.url)
    with FinishedWatcher(server.url, fleet.keys) as watcher:
        broker.ctl("set_vm_memory_high_watermark", "0.00001")  # the alarm: publishers blocked
        blocked, logged = time.monotonic(), len(fleet.scheduler.log())
        ids = fleet.submit_batch([body(f"blocked {i}") for i in range(6)])
        wait_for(
            lambda: "standing by" in fleet.scheduler.log()[logged:],
            60,
            f"the scheduler's publish to fail and the scheduler to stand by ({fleet.scheduler.log_path})",
        )
        failed_after_s = time.monotonic() - blocked
        assert fleet.scheduler.alive() and watcher.unseen(ids) == ids  # nothing ran, nothing died
        broker.ctl("set_vm_memory_high_watermark", "0.4")
        cleared = time.time()
        finishes = assert_every_request_ended_once(fleet, watcher, ids, timeout=60)
    took_s = max(float(f.finished_at or 0) for f in finishes.values()) - cleared
    print(
        f"\nRabbitMQ blocking publishers: the scheduler's publish failed and it stood by {failed_after_s:.1f} s in; "
        f"all {len(ids)} requests ended once, the last {took_s:.1f} s after the alarm cleared"
    )
