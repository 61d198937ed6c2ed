"""Building the result store that ``Settings.result_store`` names."""

from __future__ import annotations

import redis

from shared.keys import RedisKeys
from shared.results.filesystem import FilesystemResultStore
from shared.results.redis_store import RedisResultStore
from shared.results.s3 import S3ResultStore, build_s3_client
from shared.results.store import ResultStore
from shared.settings import Settings


def build_result_store(settings: Settings, redis_binary: redis.Redis) -> ResultStore:
    """The configured store; ``redis_binary`` (bytes replies) serves the Redis backend."""
    if settings.result_store == "filesystem":
        return FilesystemResultStore(settings.result_dir)
    if settings.result_store == "s3":
        assert settings.s3_bucket is not None  # Settings refuses s3 without a bucket
        client = build_s3_client(
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            timeout_s=settings.s3_timeout_s,
            path_style=settings.s3_path_style,
        )
        return S3ResultStore(client, settings.s3_bucket, prefix=settings.s3_prefix, url_ttl_s=settings.result_url_ttl_s)
    keep_s = settings.result_ttl_s + int(settings.result_orphan_grace_s)
    return RedisResultStore(
        redis_binary, RedisKeys(settings.key_prefix), max_bytes=settings.result_redis_max_bytes, keep_s=keep_s
    )
