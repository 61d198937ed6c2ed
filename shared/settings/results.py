"""Results: where finished images live (``shared.results``: Redis, a folder or S3-compatible storage), how long,
and how the api hands them out."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, model_validator

from shared.settings.concern import SettingsConcern, UserPath, default_cache_dir

ResultStoreName = Literal["redis", "filesystem", "s3"]
"""The result stores (``result_store``); ``shared.results.factory.BUILDERS`` builds each."""
S3_ATTEMPTS = 3
"""Attempts of each S3 result-store call (botocore's standard retry mode), each waiting at most ``s3_timeout_s`` to
connect and as long for a read, plus up to ``S3_ATTEMPT_SLACK_S``: ``result_store_timeout_s`` must be at least what
they may take together (``ResultSettings.s3_call_bound_s``)."""
S3_ATTEMPT_SLACK_S = 2.0
"""What an S3 attempt may add to its timeouts: botocore's 1 s wait for ``100 Continue`` before a body, its backoff."""


def _default_result_dir() -> Path:
    return default_cache_dir() / "results"


class ResultSettings(SettingsConcern):
    """The result store and its backend's settings (Redis cap, folder, S3), result lifetimes, the orphan sweeper."""

    section = "Results"

    result_ttl_s: int = Field(86_400, ge=1)
    """Seconds a finished request's state and images are kept."""

    result_store: ResultStoreName = "redis"
    """Where finished images live: 'redis' (capped by result_redis_max_bytes; simple, one host), 'filesystem'
    (result_dir, a volume every api and worker host mounts) or 's3' (any S3-compatible object storage: s3_bucket,
    s3_endpoint_url). Redis then holds only request state and image keys."""

    result_redis_max_bytes: int = Field(1024**3, ge=1024)
    """Redis result store only: bytes of images kept at most; beyond it the oldest are dropped first (their requests say
    so, and their image URLs answer 410)."""

    max_request_output_bytes: int = Field(512 * 1024**2, ge=1024)
    """Largest a request's encoded outputs may be (its images; a video's MP4 and its frames): one whose outputs encode
    larger fails alone with OutputTooLarge, before any of it is stored (only known once encoded: not refused at
    submit). Bounds what one request writes to the result store."""

    max_batch_output_bytes: int = Field(2 * 1024**3, ge=1024)
    """Largest the encoded outputs of one forward of a batch may be together (a batch is one forward unless its
    requests have several compatibility keys): its requests are counted in order, and one whose outputs would take
    the total past it fails alone with OutputTooLarge. Bounds what a batch's finish holds in memory and writes."""

    result_dir: UserPath = Field(default_factory=_default_result_dir)
    """Filesystem result store only: the folder of the images (shared by the api and the workers)."""

    s3_bucket: str | None = None
    """S3 result store only: the bucket (it must exist)."""

    s3_prefix: str = "fusefleet/"
    """S3 result store only: prefix of every object key."""

    s3_endpoint_url: str | None = None
    """S3 result store only: endpoint of a non-AWS service (MinIO, R2, GCS); unset = AWS."""

    s3_region: str | None = None
    """S3 result store only: region (unset = boto3's default)."""

    s3_path_style: bool = True
    """S3 result store only: path-style URLs (MinIO and most non-AWS services want them)."""

    s3_timeout_s: float = Field(10.0, gt=0)
    """S3 result store only: connect and read timeout per call."""

    result_store_timeout_s: float = Field(90.0, gt=0)
    """Filesystem and S3 result stores: the longest one call (a write, a read, a delete) may take; past it the call
    fails (reads: 503). A worker whose write did not return counts itself stuck (a hung NFS mount, an S3 endpoint that
    stops answering): it withdraws its slot, releases its batches to other workers and exits, and Celery starts a new
    pool process. With S3 at least 3 x (2 x s3_timeout_s + 2 s) (3 attempts, each a connect, a read and botocore's
    waits), so that the client's own timeouts end a failing call first."""

    result_delivery: Literal["stream", "redirect"] = "stream"
    """How GET /v1/requests/{id}/images/{k} answers: 'stream' the bytes through the api, or 'redirect' (307) to a
    presigned URL where the store has them (s3); others stream."""

    result_url_ttl_s: int = Field(3600, ge=1, le=604_800)
    """Lifetime of a presigned image URL (result_delivery=redirect)."""

    result_orphan_grace_s: float = Field(1800.0, gt=0)
    """A run's stored images that no finished request references (the run died between storing and finishing, or was
    fenced off) are deleted this long after the run claimed its batch. Must exceed batch_time_limit_s +
    redis_outage_retry_s (the longest a live run takes to finish)."""

    result_sweep_interval_s: float = Field(10.0, gt=0)
    """How often the scheduler's sweeper deletes the images that fell due."""

    @model_validator(mode="after")
    def _s3_is_complete(self) -> Self:
        if self.result_store != "s3":
            return self
        if not self.s3_bucket:
            raise ValueError("result_store 's3' needs s3_bucket (FUSEFLEET_S3_BUCKET)")
        if self.result_store_timeout_s < self.s3_call_bound_s:
            raise ValueError(
                f"result_store_timeout_s ({self.result_store_timeout_s}) must be at least {self.s3_call_bound_s:g} s "
                f"with s3_timeout_s {self.s3_timeout_s}: the S3 client may take that long ({S3_ATTEMPTS} attempts) "
                "before it gives up, and a worker would count a failing store as a stuck one"
            )
        return self

    @property
    def s3_call_bound_s(self) -> float:
        """The longest an S3 result-store call may take by the client's own timeouts and retries."""
        return S3_ATTEMPTS * (2 * self.s3_timeout_s + S3_ATTEMPT_SLACK_S)
