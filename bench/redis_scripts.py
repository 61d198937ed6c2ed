"""Each Lua script of a request's life alone, on a private Valkey: what it costs Redis to execute, per call and per
request (``python -m bench redis-scripts``).

The fleet measurement (``bench.redis_cost``) charges Redis's whole CPU to the requests, and its by-script figures
(``--by-script``) are wall times taken while the fleet's processes compete for the same cores. Here one process
drives the stores' own calls, one after another, for ``rounds`` batches of ``size`` requests (what one request
costs is its batch's calls over ``size``): ``RequestStore.submit`` (the api's), ``SchedulerStore.schedule`` under a
lease, ``WorkerStore.claim``, ``record_results``, ``forward_done``, the Redis result store's ``put_many`` (one
``size``-byte object a request), ``finish_many`` with the forward's last step (as the step reporter leaves it),
``batch_done`` with the run's statuses and ``SchedulerStore.free_slots``; nothing else talks to the server, so
``SLOWLOG`` (threshold 0) times each call's execution alone (the network's part not counted). Each script's figure
is the median of its calls; the run is repeated ``repeats`` times and the medians of those reported.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis
import redis.asyncio as aioredis

from api.store import RequestStore
from bench.redis_cost import script_costs, script_names
from fusefleet.valkey import EmbeddedValkey
from gpu_worker.store import Claimed, WorkerStore
from scheduler.lease import Lease
from scheduler.store import SchedulerStore
from shared.contracts import BatchMessage, RequestSpec
from shared.keys import RedisKeys
from shared.results.redis_store import RedisResultStore
from shared.settings import Settings

PREFIX = "bench"
IMAGE_BYTES = 600  # a placeholder image of the simulated runner's size class


@dataclass(frozen=True)
class ScriptFigure:
    """One script's median execution µs per call, its calls per request and so its µs per request."""

    name: str
    us_per_call: float
    calls_per_request: float

    @property
    def us_per_request(self) -> float:
        return self.us_per_call * self.calls_per_request


def _spec(request_id: str, steps: int) -> RequestSpec:
    fields = {"id": request_id, "model": "demo", "prompt": request_id, "seed": 1, "created_at": time.time()}
    return RequestSpec.model_validate({**fields, "width": 64, "height": 64, "num_inference_steps": steps})


def _lifecycle(url: str, rounds: int, size: int, steps: int) -> list[ScriptFigure]:
    settings = Settings(key_prefix=PREFIX)
    keys = RedisKeys(PREFIX)
    client = redis.Redis.from_url(url, decode_responses=True)
    binary = redis.Redis.from_url(url)
    scheduler, worker = SchedulerStore(client, settings), WorkerStore(client, settings, binary=binary)
    results = RedisResultStore(binary, keys, max_bytes=1 << 30, keep_s=settings.result_ttl_s)
    lease = Lease(client, keys.scheduler_lease, 60_000)
    assert lease.try_acquire()
    from shared import keys as scripts

    for name in script_names().values():  # loaded before the log starts: no NOSCRIPT retries in it
        client.script_load(getattr(scripts, name))
    client.config_set("slowlog-max-len", 1_000_000)
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()

    async def submit(specs: Sequence[RequestSpec]) -> None:
        api = aioredis.Redis.from_url(url, decode_responses=True)
        store = RequestStore(api, results, keys, max_queue_len=1 << 20, result_ttl_s=3600, call_timeout_s=5)
        await store.submit(specs)
        await api.aclose()

    for n in range(rounds):
        ids = [f"r{n}-{j}" for j in range(size)]
        asyncio.run(submit([_spec(rid, steps) for rid in ids]))
        batch_id = f"b{n}"
        assert scheduler.schedule(lease.key, lease.token, batch_id, ids) == ids
        token = f"t{n}"
        claim = worker.claim(BatchMessage(batch_id=batch_id, request_ids=tuple(ids), created_at=0.0), token, "w")
        assert isinstance(claim, Claimed)
        result_keys = {rid: [f"{rid}/{token}/0.png"] for rid in ids}
        worker.record_results([key for keys_of in result_keys.values() for key in keys_of])
        worker.forward_done(batch_id, token)
        refused = results.put_many([(key, b"x" * IMAGE_BYTES) for keys_of in result_keys.values() for key in keys_of])
        assert not refused, refused
        seen = dict(claim.statuses)
        seen.update(worker.finish_many(result_keys, {}, token, no_inputs=ids, progress=(steps, steps)))
        worker.batch_done(batch_id, token, seen)
        scheduler.free_slots()
    client.config_set("slowlog-log-slower-than", -1)
    costs = script_costs(client.slowlog_get(-1), script_names())
    client.close()
    binary.close()
    requests = rounds * size
    return [
        ScriptFigure(row.name, row.median_us, row.calls / requests)
        for row in costs
        if row.name.isupper()  # the scripts (the api's own HMGETs etc. are not part of this run)
    ]


def measure(rounds: int = 100, size: int = 8, steps: int = 20, repeats: int = 3) -> list[ScriptFigure]:
    """``repeats`` runs of ``rounds`` batches, each on a fresh private Valkey; per script the median over the runs
    of each run's median µs per call."""
    runs: list[list[ScriptFigure]] = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="fusefleet-redis-scripts-") as folder:
            server = EmbeddedValkey(Path(folder)).start()
            try:
                runs.append(_lifecycle(server.url, rounds, size, steps))
            finally:
                server.stop()
    names = sorted({figure.name for run in runs for figure in run})
    out = []
    for name in names:
        rows = [figure for run in runs for figure in run if figure.name == name]
        out.append(
            ScriptFigure(
                name,
                statistics.median(row.us_per_call for row in rows),
                statistics.median(row.calls_per_request for row in rows),
            )
        )
    return sorted(out, key=lambda figure: -figure.us_per_request)


def table(figures: Sequence[ScriptFigure]) -> str:
    lines = ["| script | calls / request | µs / call | µs / request |", "|---|---|---|---|"]
    for figure in figures:
        lines.append(
            f"| {figure.name} | {figure.calls_per_request:.3f} | {figure.us_per_call:.1f} "
            f"| {figure.us_per_request:.1f} |"
        )
    total = sum(figure.us_per_request for figure in figures)
    lines.append(f"| all | | | {total:.1f} |")
    return "\n".join(lines)
