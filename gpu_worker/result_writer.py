"""Ending a claimed run's requests: journal their result keys, encode and store their outputs, finish them.

Shared by the request-level executor (``gpu_worker.executor``) and the step-mode loop (``gpu_worker.step_loop``):
every write carries the claim's token (``finish.lua`` ignores a writer whose claim is not the current one), Redis
calls are retried through an outage for ``outage_retry_s`` (then the transient error is raised: the caller leaves
the batch to the reaper), a request whose output is unusable or refused by the result store fails alone, and a
result-store write that does not return raises ``FinisherStuck`` (the worker is replaced, ``gpu_worker.finisher``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from PIL import Image

from gpu_worker.finisher import FinisherStuck
from gpu_worker.images import encode
from gpu_worker.output_bounds import OUTPUT_TOO_LARGE, OutputBounds
from gpu_worker.runner import Video, video_frames
from gpu_worker.store import WorkerStore
from gpu_worker.video import encode_mp4
from shared.contracts import ErrorInfo, ModelTraits, RequestSpec, RequestStatus
from shared.results import ResultStore, ResultStoreTimeout, result_keys
from shared.retry import call_with_retry, is_transient

log = logging.getLogger(__name__)

T = TypeVar("T")
Statuses = dict[str, RequestStatus | None]


def error_info(exc: BaseException) -> ErrorInfo:
    return ErrorInfo(type=type(exc).__name__, message=str(exc) or repr(exc))


def output_problem(spec: RequestSpec, outputs: object, frames: int | None = None) -> str | None:
    """Why ``outputs`` is not a valid result for ``spec`` (``spec.n`` PIL images; or, for a video model,
    ``spec.n`` videos of ``frames`` frames each), or None."""
    kind = "images" if frames is None else "videos"
    if not isinstance(outputs, Sequence) or isinstance(outputs, str | bytes):
        return f"runner returned {type(outputs).__name__} instead of a list of {kind}"
    if len(outputs) != spec.n:
        return f"runner returned {len(outputs)} {kind}, expected {spec.n}"
    if frames is None:
        wrong = [type(image).__name__ for image in outputs if not isinstance(image, Image.Image)]
        return f"runner returned {wrong[0]} instead of an image" if wrong else None
    for video in outputs:
        if not isinstance(video, Video):
            return f"runner returned {type(video).__name__} instead of a video"
        if len(video.frames) != frames or not all(isinstance(frame, Image.Image) for frame in video.frames):
            return f"runner returned a video of {len(video.frames)} frames, expected {frames} images"
    return None


def encode_outputs(spec: RequestSpec, outputs: Sequence[Any]) -> list[bytes]:
    """The stored bytes of a request's outputs, in ``result_keys`` order: each image in the request's format; or
    each video's MP4 followed by its frames."""
    encoded: list[bytes] = []
    for output in outputs:
        if isinstance(output, Video):
            encoded.append(encode_mp4(output.frames, output.fps))
            encoded += [encode(frame, spec.output_format, spec.output_compression) for frame in output.frames]
        else:
            encoded.append(encode(output, spec.output_format, spec.output_compression))
    return encoded


def _no_inputs(specs: Sequence[RequestSpec]) -> set[str]:
    """The requests whose task needs no input image: ending them has no input fields to delete."""
    return {spec.id for spec in specs if not spec.task.needs_image}


class ResultWriter:
    """Writes the outcome of a claimed run's requests, for one worker process (its store, result store and
    model traits)."""

    def __init__(
        self, store: WorkerStore, results: ResultStore, traits: ModelTraits, *, outage_retry_s: float = 0.0
    ) -> None:
        self.store = store
        self._results = results
        self._traits = traits
        self._outage_retry_s = outage_retry_s

    @property
    def outage_retry_s(self) -> float:
        """How long ``redis`` retries a call through an outage."""
        return self._outage_retry_s

    bounds: OutputBounds = OutputBounds()
    """What a request's and a forward's encoded outputs may take (``gpu_worker.output_bounds``; the worker sets
    ``max_request_output_bytes`` and ``max_batch_output_bytes``): unbounded by default."""

    def redis(self, call: Callable[[], T], what: str) -> T:
        """``call()``, retried through a Redis outage for ``outage_retry_s`` (then its error is raised)."""
        return call_with_retry(call, what=what, give_up_after_s=self._outage_retry_s)

    def journal(self, specs: Sequence[RequestSpec], token: str) -> None:
        """Journal the result keys this claim may write for ``specs`` (before the first forward or step that can
        produce them): a run that dies between storing and finishing leaves them to the sweeper."""
        keys = [key for spec in specs for key in result_keys(spec, token, video_frames(spec, self._traits))]
        if keys:
            self.redis(lambda: self.store.record_results(keys), "journaling result keys")

    def fail(self, errors: dict[str, ErrorInfo], token: str) -> Statuses:
        """End these requests of this claim as failed, each with its error (an abort flag wins: aborted)."""
        if not errors:
            return {}
        return self.redis(lambda: self.store.finish_many({}, errors, token), "failing requests")

    def abort(self, specs: Sequence[RequestSpec], token: str, *, retry: bool = True) -> Statuses:
        """End these requests of this claim, found aborted, at once and without storing anything: ``aborted`` with
        no images (``WorkerStore.finish_aborted``), and the result keys journaled for them fall due at once. With
        ``retry`` (default) Redis calls are retried through an outage for ``outage_retry_s``; without, the error is
        raised at once (the step reporter's thread tries again with its next report)."""
        if not specs:
            return {}
        keys = {spec.id: result_keys(spec, token, video_frames(spec, self._traits)) for spec in specs}
        plain = _no_inputs(specs)
        if not retry:
            return self.store.finish_aborted(keys, token, no_inputs=plain)
        return self.redis(lambda: self.store.finish_aborted(keys, token, no_inputs=plain), "ending aborted requests")

    def store_results(
        self,
        specs: Sequence[RequestSpec],
        outputs: Sequence[object],
        token: str,
        *,
        progress: tuple[int, int] | None = None,
    ) -> Statuses:
        """Encode every request's outputs, write them all to the result store (``put_many``: one round trip for the
        Redis store), and finish the requests in one round trip, with their forward's last ``progress`` (step,
        total) when the step reporter left it unwritten; a request whose output is wrong, or that the store
        refuses, fails alone."""
        encoded: dict[str, list[tuple[str, bytes]]] = {}
        errors: dict[str, ErrorInfo] = {}
        budget = self.bounds.budget()
        for spec, output in zip(specs, outputs, strict=True):
            frames = video_frames(spec, self._traits)
            problem = output_problem(spec, output, frames)
            if problem is not None:
                errors[spec.id] = ErrorInfo(type="RunnerError", message=problem)
                continue
            assert isinstance(output, Sequence)
            try:
                items = list(zip(result_keys(spec, token, frames), encode_outputs(spec, output), strict=True))
            except Exception as exc:  # noqa: BLE001 - a bad image fails its request, not the batch
                message = f"encoding the image failed: {type(exc).__name__}: {exc}"
                errors[spec.id] = ErrorInfo(type="RunnerError", message=message)
                continue
            too_large = budget.take(sum(len(data) for _, data in items))
            if too_large is not None:  # dropped before anything of it is stored
                errors[spec.id] = ErrorInfo(type=OUTPUT_TOO_LARGE, message=too_large)
            else:
                encoded[spec.id] = items
        refused = self._put_many([item for items in encoded.values() for item in items])
        stored: dict[str, list[str]] = {}
        for request_id, items in encoded.items():
            problems = [refused[key] for key, _ in items if key in refused]
            if problems:  # the store refused one of its objects: this request fails
                errors[request_id] = ErrorInfo(type="ResultStoreError", message=problems[0])
            else:
                stored[request_id] = [key for key, _ in items]
        if errors:
            log.warning("%d requests returned unusable output: %s", len(errors), errors)
        plain = _no_inputs(specs)
        return self.redis(
            lambda: self.store.finish_many(stored, errors, token, no_inputs=plain, progress=progress),
            "storing results",
        )

    def _put_many(self, items: Sequence[tuple[str, bytes]]) -> dict[str, str]:
        """Write the outputs to the result store (a Redis store's writes are retried through an outage); the keys
        it refused, each with why. A store that fails as a whole (not an outage) refuses them all. A write that did
        not return within ``result_store_timeout_s`` is not its request's failure: the store hangs under this
        worker, which must be replaced (``FinisherStuck``; the batch runs again elsewhere)."""
        if not items:
            return {}
        try:
            refused = self.redis(lambda: self._results.put_many(items), "storing images")
        except ResultStoreTimeout as exc:
            raise FinisherStuck(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - the store refused them (or stayed away): their requests fail
            if is_transient(exc):
                raise
            return {key: str(exc) or repr(exc) for key, _ in items}
        return {key: str(exc) or repr(exc) for key, exc in refused.items()}
