"""Where finished images live: a result store (Redis, a folder, or S3-compatible object storage) and the Redis
journal that makes sure no object outlives its request.

Workers write each image straight to the store under a key of their run (``store.result_key``), after journaling
it (``journal.ResultJournal``); the request hash keeps only the keys. The api reads the bytes back (or redirects to
a presigned URL), and the scheduler's sweeper deletes what fell due. ``docs/deploy.md`` compares the backends.
"""

from shared.results.factory import build_result_store
from shared.results.journal import ResultJournal
from shared.results.store import (
    ResultStore,
    ResultStoreError,
    ResultStoreTimeout,
    is_video_key,
    media_type_of,
    result_key,
    result_keys,
)

__all__ = [
    "ResultJournal",
    "ResultStore",
    "ResultStoreError",
    "ResultStoreTimeout",
    "build_result_store",
    "is_video_key",
    "media_type_of",
    "result_key",
    "result_keys",
]
