"""Running one batch: claim it, run it fused (or request by request), store every result under its request id.

A failing fused forward does not fail innocent peers: its requests are re-run one by one, so only the culprit
ends ``failed`` (with the exception's type and message). Abort flags are read between denoising steps; when every
request of the forward is aborted, the forward stops. Aborted requests end ``aborted`` without images.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from celery.exceptions import SoftTimeLimitExceeded
from PIL import Image

from gpu_worker.heartbeat import Heartbeat
from gpu_worker.images import to_png
from gpu_worker.runner import BatchRunner, StepCallback
from gpu_worker.store import Claimed, Locked, WorkerStore
from shared.contracts import BatchMessage, ErrorInfo, RequestSpec, RequestStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What happened to each request of a batch this worker claimed."""

    batch_id: str
    statuses: dict[str, RequestStatus | None]


def error_info(exc: BaseException) -> ErrorInfo:
    return ErrorInfo(type=type(exc).__name__, message=str(exc) or repr(exc))


class BatchExecutor:
    """Executes batches in one worker process with one loaded runner."""

    def __init__(self, store: WorkerStore, runner: BatchRunner, worker: str, heartbeat: Heartbeat | None) -> None:
        self._store = store
        self._runner = runner
        self._worker = worker
        self._heartbeat = heartbeat

    def execute(self, batch: BatchMessage) -> BatchOutcome | Locked:
        """Run ``batch`` unless another worker holds it (then ``Locked``: retry later)."""
        token = uuid.uuid4().hex
        claim = self._store.claim(batch, token, self._worker)
        if isinstance(claim, Locked):
            return claim
        if self._heartbeat is not None:
            self._heartbeat.hold(batch.batch_id, token)
        try:
            statuses = dict(claim.statuses)
            statuses.update(self._run_claimed(claim))
            return BatchOutcome(batch.batch_id, statuses)
        finally:
            if self._heartbeat is not None:
                self._heartbeat.release()
            self._store.batch_done(batch.batch_id, token)

    def _run_claimed(self, claim: Claimed) -> dict[str, RequestStatus | None]:
        specs = claim.specs
        if not specs:
            return {}
        try:
            if self._runner.fused and len(specs) > 1:
                return self._run_fused(specs)
            return self._run_each(specs)
        except SoftTimeLimitExceeded as exc:
            log.error("batch ran past its time limit; failing its unfinished requests")
            return {spec.id: self._store.fail(spec.id, error_info(exc)) for spec in specs}

    def _run_fused(self, specs: Sequence[RequestSpec]) -> dict[str, RequestStatus | None]:
        try:
            images = self._runner.run(specs, self._step_callback(specs))
        except SoftTimeLimitExceeded:
            raise
        except Exception:
            log.exception("fused forward of %d requests failed; re-running them one by one", len(specs))
            return self._run_each(specs)
        return self._store_results(specs, images)

    def _run_each(self, specs: Sequence[RequestSpec]) -> dict[str, RequestStatus | None]:
        statuses: dict[str, RequestStatus | None] = {}
        for spec in specs:
            try:
                (images,) = self._runner.run([spec], self._step_callback([spec]))
            except SoftTimeLimitExceeded:
                raise
            except Exception as exc:
                log.warning("request %s failed: %s: %s", spec.id, type(exc).__name__, exc)
                statuses[spec.id] = self._store.fail(spec.id, error_info(exc))
                continue
            statuses.update(self._store_results([spec], [images]))
        return statuses

    def _store_results(
        self, specs: Sequence[RequestSpec], images: Sequence[Sequence[Image.Image]]
    ) -> dict[str, RequestStatus | None]:
        """Store every request's images in one round trip (a runner returning a wrong count fails that request)."""
        statuses: dict[str, RequestStatus | None] = {}
        pngs: dict[str, list[bytes]] = {}
        for spec, imgs in zip(specs, images, strict=True):
            if len(imgs) == spec.n:
                pngs[spec.id] = [to_png(image) for image in imgs]
            else:
                message = f"runner returned {len(imgs)} images, expected {spec.n}"
                statuses[spec.id] = self._store.fail(spec.id, ErrorInfo(type="RunnerError", message=message))
        statuses.update(self._store.succeed_many(pngs))
        return statuses

    def _step_callback(self, specs: Sequence[RequestSpec]) -> StepCallback:
        ids = [spec.id for spec in specs]

        def on_step(step: int, total: int) -> bool:
            return all(self._store.progress(ids, step, total))

        return on_step
