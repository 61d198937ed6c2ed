"""Building the result store that ``Settings.result_store`` names."""

from __future__ import annotations

import redis

from shared.keys import RedisKeys
from shared.results.deadline import MAX_CALLS, DeadlineStore
from shared.results.filesystem import FilesystemResultStore
from shared.results.redis_store import RedisResultStore
from shared.results.s3 import S3ResultStore, build_s3_client
from shared.results.store import ResultStore
from shared.settings import Settings


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
    if settings.result_store == "filesystem":
        return DeadlineStore(FilesystemResultStore(settings.result_dir), timeout_s, max_calls=max_calls)
    if settings.result_store == "s3":
        assert settings.s3_bucket is not None  # Settings refuses s3 without a bucket
        client = build_s3_client(
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            timeout_s=settings.s3_timeout_s,
            path_style=settings.s3_path_style,
        )
        s3 = S3ResultStore(client, settings.s3_bucket, prefix=settings.s3_prefix, url_ttl_s=settings.result_url_ttl_s)
        return DeadlineStore(s3, timeout_s, max_calls=max_calls)
    keep_s = settings.result_ttl_s + int(settings.result_orphan_grace_s)
    return RedisResultStore(
        redis_binary, RedisKeys(settings.key_prefix), max_bytes=settings.result_redis_max_bytes, keep_s=keep_s
    )
