"""A real S3-protocol server for tests: moto's server mode (an HTTP server speaking the S3 API, in a thread of the
test process) on a free port, with one bucket. Chosen over MinIO because it installs from PyPI (no binary, no
docker) and speaks the same protocol boto3 speaks to AWS, presigned URLs included."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.redis_server import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "fusefleet-test", "AWS_SECRET_ACCESS_KEY": "fusefleet-test-secret"}
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    bucket: str
    client: Any  # a boto3 S3 client for the test's own checks

    def env(self, prefix: str = "fusefleet/") -> dict[str, str]:
        """What a fleet process needs to use this server as its result store."""
        return {
            "FUSEFLEET_RESULT_STORE": "s3",
            "FUSEFLEET_S3_BUCKET": self.bucket,
            "FUSEFLEET_S3_PREFIX": prefix,
            "FUSEFLEET_S3_ENDPOINT_URL": self.endpoint_url,
            "FUSEFLEET_S3_REGION": REGION,
            **CREDENTIALS,
        }

    def keys(self, prefix: str = "") -> set[str]:
        """Every object key under ``prefix``."""
        found: set[str] = set()
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            found.update(item["Key"] for item in page.get("Contents", []))
        return found


@contextmanager
def s3_server(bucket: str = "fusefleet-results") -> Iterator[S3Server]:
    """A started moto S3 server holding only an empty ``bucket``; the AWS credential variables are set for this
    process too. moto keeps its buckets in module state shared by every server of a process, so each start resets
    it: objects a test before this one (in the same pytest process) stored never show up here."""
    import boto3
    from moto.server import ThreadedMotoServer

    for name, value in CREDENTIALS.items():
        os.environ.setdefault(name, value)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        httpx.post(f"{endpoint}/moto-api/reset", timeout=10).raise_for_status()
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        client.create_bucket(Bucket=bucket)
        yield S3Server(endpoint, bucket, client)
    finally:
        server.stop()
