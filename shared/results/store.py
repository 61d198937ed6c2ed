"""The result store's interface, its key scheme, and its one error type.

A result-store key names one image of one run: ``{request_id}/{claim_token}/{index}.{format}``. The claim token
makes the keys of two runs of the same request distinct, so a late writer (a run fenced off after its lock
lapsed) never overwrites the images a later run stored; its objects fall due in the results journal and are
swept. The extension is the request's ``output_format``, which gives the media type.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from shared.contracts import OutputFormat, RequestSpec

KEY_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}/[A-Za-z0-9_-]{1,128}/[0-9]{1,4}\.(png|jpeg|webp)$")


class ResultStoreError(Exception):
    """A result store could not store, read or delete an object (the message says which and why)."""


def result_key(request_id: str, token: str, index: int, output_format: OutputFormat) -> str:
    return f"{request_id}/{token}/{index}.{output_format.value}"


def result_keys(spec: RequestSpec, token: str) -> list[str]:
    """The keys of the ``spec.n`` images the run under ``token`` stores for ``spec``."""
    return [result_key(spec.id, token, index, spec.output_format) for index in range(spec.n)]


def output_format_of(key: str) -> OutputFormat:
    return OutputFormat(key.rsplit(".", 1)[-1])


def check_key(key: str) -> str:
    """``key`` if it has the result-key shape (no path tricks reach a backend); ValueError otherwise."""
    if not KEY_PATTERN.match(key):
        raise ValueError(f"not a result-store key: {key!r}")
    return key


class ResultStore(Protocol):
    """Where finished images live. Synchronous (the api calls it in a worker thread); every method is bounded by
    the backend's own timeouts and raises ``ResultStoreError`` when the backend fails.

    Deleting a missing object is not an error; reading one gives None.
    """

    kind: str
    """The backend's name, as ``result_store`` selects it: ``redis``, ``filesystem`` or ``s3``."""

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes | None: ...

    def delete(self, keys: Sequence[str]) -> None: ...

    def url(self, key: str) -> str | None:
        """A URL a client can GET the object from directly for a while (presigned), or None if the backend has
        none (then the api streams the bytes)."""
        ...
