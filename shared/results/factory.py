"""Building the result store that ``Settings.result_store`` names: ``BUILDERS`` holds one builder per name of
``shared.settings.ResultStoreName`` (a new store: its builder here, its name and settings in
``shared/settings/results.py``)."""

from __future__ import annotations

from collections.abc import Callable

import redis

from shared.keys import RedisKeys
from shared.results.deadline import MAX_CALLS, DeadlineStore
from shared.results.filesystem import FilesystemResultStore
from shared.results.redis_store import RedisResultStore
from shared.results.s3 import S3ResultStore, build_s3_client
from shared.results.store import ResultStore
from shared.settings import ResultStoreName, Settings

ResultStoreBuilder = Callable[[Settings, redis.Redis, float, int], ResultStore]
"""(settings, a Redis client with bytes replies, the bound of one call in seconds, the most calls at once) -> the
store."""


def build_result_store(
    settings: Settings,
    redis_binary: redis.Redis,
    *,
    call_timeout_s: float | None = None,
    max_calls: int = MAX_CALLS,
) -> ResultStore:
    """The configured store; ``redis_binary`` (bytes replies) serves the Redis backend. A folder's and S3's calls
    are bounded by ``result_store_timeout_s``, or the caller's own ``call_timeout_s`` when shorter (the api: its
    thread is then free when it answers 503), at most ``max_calls`` running at once (``DeadlineStore``); Redis's by
    its socket timeouts."""
    timeout_s = min(settings.result_store_timeout_s, call_timeout_s or settings.result_store_timeout_s)
    return BUILDERS[settings.result_store](settings, redis_binary, timeout_s, max_calls)


def _redis(settings: Settings, redis_binary: redis.Redis, timeout_s: float, max_calls: int) -> ResultStore:
    keep_s = settings.result_ttl_s + int(settings.result_orphan_grace_s)
    return RedisResultStore(
        redis_binary, RedisKeys(settings.key_prefix), max_bytes=settings.result_redis_max_bytes, keep_s=keep_s
    )


def _filesystem(settings: Settings, redis_binary: redis.Redis, timeout_s: float, max_calls: int) -> ResultStore:
    return DeadlineStore(FilesystemResultStore(settings.result_dir), timeout_s, max_calls=max_calls)


def _s3(settings: Settings, redis_binary: redis.Redis, timeout_s: float, max_calls: int) -> ResultStore:
    assert settings.s3_bucket is not None  # ResultSettings refuses s3 without a bucket
    client = build_s3_client(
        endpoint_url=settings.s3_endpoint_url,
        region=settings.s3_region,
        timeout_s=settings.s3_timeout_s,
        path_style=settings.s3_path_style,
    )
    s3 = S3ResultStore(client, settings.s3_bucket, prefix=settings.s3_prefix, url_ttl_s=settings.result_url_ttl_s)
    return DeadlineStore(s3, timeout_s, max_calls=max_calls)


BUILDERS: dict[ResultStoreName, ResultStoreBuilder] = {"redis": _redis, "filesystem": _filesystem, "s3": _s3}
"""Each result store's builder, by its ``result_store`` name (every name has one:
``tests/unit/test_result_stores.py``)."""
