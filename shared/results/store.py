"""The result store's interface, its key scheme, and its one error type.

A result-store key names one object of one run: ``{request_id}/{claim_token}/{name}``, where ``name`` is
``{k}.{format}`` for image ``k`` of an image request, and for video ``k`` of a video request ``{k}.mp4`` followed
by its frames ``{k}-{f}.{format}``. The claim token makes the keys of two runs of the same request distinct, so a
late writer (a run fenced off after its lock lapsed) never overwrites what a later run stored; its objects fall
due in the results journal and are swept. The extension gives the media type.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from shared.contracts import VIDEO_EXTENSION, OutputFormat, RequestSpec

KEY_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}/[A-Za-z0-9_-]{1,128}/[0-9]{1,4}(-[0-9]{1,5})?\.(png|jpeg|webp|mp4)$")
VIDEO_MEDIA_TYPE = "video/mp4"


class ResultStoreError(Exception):
    """A result store could not store, read or delete an object (the message says which and why)."""


class ResultStoreTimeout(ResultStoreError):
    """A result-store call did not return within its deadline (``shared.results.deadline``): the backend hangs (a
    stuck NFS mount, an S3 endpoint that stops answering). The call's thread may still be stuck in it."""


def result_key(request_id: str, token: str, index: int, output_format: OutputFormat) -> str:
    return f"{request_id}/{token}/{index}.{output_format.value}"


def result_keys(spec: RequestSpec, token: str, frames: int | None = None) -> list[str]:
    """The keys of what the run under ``token`` stores for ``spec``: its ``spec.n`` images, or, for a video request
    of ``frames`` frames, each video's MP4 followed by its frames."""
    if frames is None:
        return [result_key(spec.id, token, index, spec.output_format) for index in range(spec.n)]
    keys: list[str] = []
    for k in range(spec.n):
        keys.append(f"{spec.id}/{token}/{k}.{VIDEO_EXTENSION}")
        keys += [f"{spec.id}/{token}/{k}-{f}.{spec.output_format.value}" for f in range(frames)]
    return keys


def is_video_key(key: str) -> bool:
    return key.endswith("." + VIDEO_EXTENSION)


def media_type_of(key: str) -> str:
    """The media type of a result key's object (by its extension)."""
    extension = key.rsplit(".", 1)[-1]
    return VIDEO_MEDIA_TYPE if extension == VIDEO_EXTENSION else OutputFormat(extension).media_type


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

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> dict[str, ResultStoreError]:
        """Store each ``(key, data)`` (a batch's outputs: the Redis store in one round trip, ``put_each`` elsewhere);
        returns the keys it refused, each with its error, the others stored. Raises what ``put`` raises for the store
        as a whole (``ResultStoreTimeout``; a Redis store's connection errors)."""
        ...

    def get(self, key: str) -> bytes | None: ...

    def delete(self, keys: Sequence[str]) -> None: ...

    def url(self, key: str) -> str | None:
        """A URL a client can GET the object from directly for a while (presigned), or None if the backend has
        none (then the api streams the bytes)."""
        ...


def put_each(store: ResultStore, items: Sequence[tuple[str, bytes]]) -> dict[str, ResultStoreError]:
    """``put_many`` as one ``put`` per object (a store with no cheaper way): a refused object is recorded and the
    rest go on; a call that did not return (``ResultStoreTimeout``) ends them all. Every key is checked first."""
    for key, _ in items:
        check_key(key)
    refused: dict[str, ResultStoreError] = {}
    for key, data in items:
        try:
            store.put(key, data)
        except ResultStoreTimeout:
            raise
        except ResultStoreError as exc:
            refused[key] = exc
    return refused
