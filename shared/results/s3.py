"""The S3-compatible result store (AWS S3, MinIO, Cloudflare R2, GCS interoperability), through boto3.

Objects are ``{prefix}{request_id}/{token}/{index}.{format}`` in one bucket, which must exist. Credentials come the
standard AWS ways (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, a profile, an instance role). Every call
is bounded by connect and read timeouts with a few retries (botocore's standard mode); a failure raises
``ResultStoreError``. Presigned GET URLs let the api redirect clients to the bucket instead of streaming.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.results.store import ResultStoreError, check_key, media_type_of, put_each
from shared.settings import S3_ATTEMPTS

DELETE_PAGE = 1000  # DeleteObjects takes at most this many keys


class S3ResultStore:
    kind = "s3"

    def __init__(self, client: Any, bucket: str, *, prefix: str = "", url_ttl_s: int = 3600) -> None:
        """``client`` is a boto3 S3 client (``build_s3_client``)."""
        self._s3 = client
        self.bucket = bucket
        self.prefix = prefix
        self._url_ttl_s = url_ttl_s

    def _object(self, key: str) -> str:
        """The object name of ``key``; ValueError (never ResultStoreError) when it is not a result key, so it is
        called outside the ``try`` blocks below."""
        return self.prefix + check_key(key)

    def put(self, key: str, data: bytes) -> None:
        name, media_type = self._object(key), media_type_of(key)  # ValueError before any call
        try:
            self._s3.put_object(Bucket=self.bucket, Key=name, Body=data, ContentType=media_type)
        except Exception as exc:  # noqa: BLE001 - botocore's many error types: one meaning here
            raise ResultStoreError(f"storing {key} in s3://{self.bucket}/{self.prefix} failed: {exc}") from exc

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> dict[str, ResultStoreError]:
        return put_each(self, items)

    def get(self, key: str) -> bytes | None:
        name = self._object(key)
        try:
            reply = self._s3.get_object(Bucket=self.bucket, Key=name)
            data: bytes = reply["Body"].read()
        except self._s3.exceptions.NoSuchKey:
            return None
        except Exception as exc:  # noqa: BLE001
            raise ResultStoreError(f"reading {key} from s3://{self.bucket}/{self.prefix} failed: {exc}") from exc
        return data

    def delete(self, keys: Sequence[str]) -> None:
        objects = [{"Key": self._object(key)} for key in keys]
        for start in range(0, len(objects), DELETE_PAGE):
            page = objects[start : start + DELETE_PAGE]
            try:
                reply = self._s3.delete_objects(Bucket=self.bucket, Delete={"Objects": page, "Quiet": True})
            except Exception as exc:  # noqa: BLE001
                raise ResultStoreError(f"deleting from s3://{self.bucket}/{self.prefix} failed: {exc}") from exc
            errors = reply.get("Errors") or []
            if errors:
                first = errors[0]
                raise ResultStoreError(
                    f"deleting {len(errors)} objects from s3://{self.bucket} failed, e.g. {first.get('Key')}: "
                    f"{first.get('Code')} {first.get('Message')}"
                )

    def url(self, key: str) -> str | None:
        name = self._object(key)
        try:
            url: str = self._s3.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": name}, ExpiresIn=self._url_ttl_s
            )
        except Exception as exc:  # noqa: BLE001
            raise ResultStoreError(f"presigning {key} failed: {exc}") from exc
        return url


def build_s3_client(
    *, endpoint_url: str | None, region: str | None, timeout_s: float, path_style: bool
) -> Any:
    """A boto3 S3 client with bounded calls. An empty ``endpoint_url`` or ``region`` counts as unset (AWS, boto3's
    default region), as ``FUSEFLEET_S3_ENDPOINT_URL=`` in an env file means. ImportError says to install the ``s3``
    extra."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise ImportError("the s3 result store needs boto3: pip install 'fusefleet[s3]'") from exc
    config = Config(
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        retries={"max_attempts": S3_ATTEMPTS, "mode": "standard"},
        s3={"addressing_style": "path" if path_style else "auto"},
        signature_version="s3v4",
    )
    return boto3.client("s3", endpoint_url=endpoint_url or None, region_name=region or None, config=config)
