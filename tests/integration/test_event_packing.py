"""An ended request's event stream is packed (lib_end_request.lua): a stream reserves 4 KiB for its entries, so
the script that ends a request copies it (``COPY`` keeps only the bytes used) and renames the copy back over it.
Real Valkey: the memory figure is the server's own, which fakeredis does not have. (``DUMP`` + ``RESTORE`` with the
TTL would pack it in two commands instead of three, and costs more: ``python -m bench redis-scripts``, FINISH
about 7 µs a request more.)"""

from __future__ import annotations

import redis

from shared import keys as k
from tests.support.redis_server import RedisServer

TTL_S = 600


def test_ending_packs_the_event_stream_and_keeps_its_entries_ids_and_ttl(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    keys = k.RedisKeys("pack")
    rid = "r1"
    events = keys.request_events(rid)
    for event in ("queued", "scheduled", "running"):
        client.xadd(events, {"event": event})
    client.hset(keys.request(rid), mapping={"status": "running", "claim": "c1", "spec": "{}"})
    unpacked = client.memory_usage(events)
    before = client.xrange(events)
    finish = client.register_script(k.FINISH)
    args: list[str | int | float] = [1.0, TTL_S, keys.finished, "c1", rid, "failed", "E", "boom", "1", 0]
    assert finish(keys=k.finish_keys(keys, rid), args=args) == ["failed"]
    after = client.xrange(events)
    assert after[:3] == before and [fields["event"] for _, fields in after] == [
        "queued",
        "scheduled",
        "running",
        "failed",
    ]
    assert client.xinfo_stream(events)["last-generated-id"] == after[-1][0]  # new entries keep counting from it
    packed = client.memory_usage(events)
    assert unpacked is not None and packed is not None and packed < 1024 < unpacked, (packed, unpacked)
    assert 0 < client.ttl(events) <= TTL_S and 0 < client.ttl(keys.request(rid)) <= TTL_S
    assert not client.exists(keys.request_events_packed(rid))
    client.close()
