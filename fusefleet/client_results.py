"""The outcome of one request of ``generate`` (``fusefleet.client``): ``Result`` and its ``ResultError``.

A ``Result`` is built one of three ways: ``refused`` (never queued: invalid, or the queue said no), ``finished``
(terminal, with its images when it succeeded) or ``interrupted`` (accepted, but waiting or fetching its images
failed). ``error`` is None exactly when the request succeeded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Self

from fusefleet.client_errors import FusefleetError, RequestFailed, RequestRejected, WaitTimeout
from fusefleet.client_images import to_pil
from shared.contracts import OutputFormat, RequestStatus
from shared.wire import GenerateRequest, RequestView

if TYPE_CHECKING:
    from PIL import Image as PILImage


@dataclass(frozen=True, slots=True)
class ResultError:
    """Why a request did not succeed: the worker's exception ``type`` and ``message``, or the client's error
    (``RequestRejected`` with the refused ``field``, ``QueueFull``, ``WaitTimeout``, ``Aborted``, ...)."""

    type: str
    message: str
    field: str | None = None

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"

    @classmethod
    def of(cls, exc: FusefleetError) -> ResultError:
        return cls(type(exc).__name__, exc.message, exc.field if isinstance(exc, RequestRejected) else None)


ABORTED = ResultError("Aborted", "the request was aborted")


@dataclass(slots=True)
class Result:
    """The outcome of one request of ``generate``.

    ``index`` is its place in the input list; ``request`` the validated request (None when the client refused
    it before sending); ``id`` is None when it was refused (never queued); ``status`` is its last known status
    (None when refused); ``error`` is None exactly when it succeeded; ``images`` holds its images (bytes, in
    ``output_format``); ``view`` is its last state as the api reported it.
    """

    index: int
    request: GenerateRequest | None
    id: str | None = None
    status: RequestStatus | None = None
    error: ResultError | None = None
    images: list[bytes] = field(default_factory=list)
    view: RequestView | None = None

    @property
    def ok(self) -> bool:
        return self.status is RequestStatus.SUCCEEDED and self.error is None

    @property
    def output_format(self) -> OutputFormat:
        """The encoding of ``images`` (also their file extension): as the api reports it, else as requested."""
        if self.view is not None:
            return self.view.params.output_format
        return self.request.output_format if self.request is not None else OutputFormat.PNG

    def pil_images(self) -> list[PILImage.Image]:
        """The images as PIL images. Needs Pillow (imported on first use; an ImportError says how to install it)."""
        return to_pil(self.images)

    def save(self, folder: str | os.PathLike[str], stem: str | None = None) -> list[Path]:
        """Write the images as ``folder/<stem or id>-<k>.<output_format>`` (``.png``, ``.jpeg`` or ``.webp``; the
        folder is created); the paths written."""
        if not self.images:
            return []
        name = stem or self.id or f"request{self.index}"
        extension = self.output_format.value
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for k, data in enumerate(self.images):
            path = out / f"{name}-{k}.{extension}"
            path.write_bytes(data)
            paths.append(path)
        return paths

    def raise_for_error(self) -> Self:
        """This result, or ``RequestFailed`` when the request did not succeed."""
        if self.error is not None:
            raise RequestFailed(self.id, self.error.type, self.error.message, self.error.field)
        return self


def refused(index: int, request: GenerateRequest | None, exc: FusefleetError) -> Result:
    """The request was never queued: the client or the api refused it (``exc``)."""
    return Result(index=index, request=request, error=ResultError.of(exc))


def finished(index: int, request: GenerateRequest, view: RequestView, images: list[bytes]) -> Result:
    """The request ended (``view`` is terminal); ``images`` are its images when it succeeded."""
    error: ResultError | None = None
    if view.status is RequestStatus.FAILED:
        reported = view.error
        error = ResultError(reported.type, reported.message) if reported else ResultError("Failed", "no reason given")
    elif view.status is RequestStatus.ABORTED:
        error = ABORTED
    return Result(index, request, view.id, view.status, error, images, view)


def interrupted(index: int, request: GenerateRequest, request_id: str, exc: FusefleetError) -> Result:
    """The request was accepted, but waiting for it or fetching its images failed."""
    view = exc.view if isinstance(exc, WaitTimeout) else None
    status = view.status if view is not None else RequestStatus.QUEUED
    return Result(index, request, request_id, status, ResultError.of(exc), [], view)
