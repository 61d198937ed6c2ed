"""A running set of requests over the step engine: ``gpu_worker.runner.StepSet`` for ``StepEngine``.

The engine runs rows (one output image each); the worker thinks in requests. A request of ``n`` outputs is ``n``
rows that join together with the same steps, so they finish in the same step: the request is finished when all its
rows are, and its images are then decoded (with every other request finishing in that step's ``outputs`` call) in
one VAE call. Threads as the engine's: ``join``, ``step`` and ``outputs`` on the loop's thread; ``abort``,
``progress`` and ``requests`` from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence

import torch
from PIL import Image

from gpu_worker.runner import InputImages
from gpu_worker.step_engine.engine import StepEngine
from gpu_worker.step_engine.rows import Finished, Row, rows_of
from shared.contracts import RequestSpec


class RequestSet:
    """The requests of one running set on ``engine`` (one step key); generators on ``device``."""

    def __init__(self, engine: StepEngine, device: torch.device | str = "cpu") -> None:
        self.engine = engine
        self._device = device
        self._lock = threading.Lock()
        self._outputs: dict[str, int] = {}  # live request id -> its n, in joining order
        self._done: dict[str, list[Finished]] = {}  # its finished rows so far
        self._totals: dict[str, int] = {}  # its denoiser calls in all

    @property
    def requests(self) -> tuple[str, ...]:
        """The requests joined and not yet output or aborted, in joining order."""
        with self._lock:
            return tuple(self._outputs)

    def join(
        self, specs: Sequence[RequestSpec], inputs: Mapping[str, InputImages] | None = None
    ) -> dict[str, str]:
        """Add every request's rows (prompts encoded in one batch; an image task's rows with its ``inputs``);
        ``{request id: why}`` for those refused. When the engine refuses the whole batch, the requests join one by
        one so only the refused ones are reported."""
        given = inputs or {}

        def rows(spec: RequestSpec) -> list[Row]:
            images = given.get(spec.id)
            if images is None:
                return rows_of(spec, self._device)
            return rows_of(spec, self._device, images.image, images.mask)

        with self._lock:
            taken = set(self._outputs)
        refused: dict[str, str] = {}
        admitted: list[RequestSpec] = []
        for spec in specs:  # one request id joins once: the engine's duplicate check is per row
            if spec.id in taken:
                refused[spec.id] = f"request {spec.id} is already in the running set"
            else:
                taken.add(spec.id)
                admitted.append(spec)
        if not admitted:
            return refused
        try:
            self.engine.join([row for spec in admitted for row in rows(spec)])
        except ValueError:
            joined = []
            for spec in admitted:
                try:
                    self.engine.join(rows(spec))
                except ValueError as exc:
                    refused[spec.id] = str(exc)
                    continue
                joined.append(spec)
        else:
            joined = admitted
        totals = {row.request_id: row.total for row in self.engine.progress()}
        with self._lock:
            for spec in joined:
                self._outputs[spec.id] = spec.n
                self._done[spec.id] = []
                self._totals[spec.id] = totals.get(spec.id, spec.num_inference_steps)
        return refused

    def step(self, only: Collection[str] | None = None) -> list[str]:
        """One fused denoising step of every live request (or of the requests ``only`` names); the requests it
        finished, in joining order. Raises what the denoiser raises, every request left as before the step."""
        rows = None
        if only is not None:
            wanted = set(only)
            rows = [row.row_id for row in self.engine.progress() if row.request_id in wanted]
        finished = self.engine.step(only=rows)
        with self._lock:
            touched = set()
            for done in finished:
                rid = done.row.request_id
                if rid in self._done:  # not aborted meanwhile
                    self._done[rid].append(done)
                    touched.add(rid)
            return [rid for rid, n in self._outputs.items() if rid in touched and len(self._done[rid]) == n]

    def outputs(self, request_ids: Sequence[str]) -> list[list[Image.Image]]:
        """The images of each finished request (all decoded in one call), in order of their outputs; the requests
        leave the set. KeyError for a request that is not finished."""
        with self._lock:
            per_request: list[list[Finished]] = []
            for rid in request_ids:
                done = sorted(self._done[rid], key=lambda finished: finished.row.output)
                if len(done) != self._outputs[rid]:
                    raise KeyError(f"request {rid} is not finished")
                per_request.append(done)
            for rid in request_ids:
                del self._outputs[rid], self._done[rid], self._totals[rid]
        images = self.engine.decode([row for rows in per_request for row in rows])
        out: list[list[Image.Image]] = []
        for rows in per_request:
            out.append(list(images[: len(rows)]))
            images = images[len(rows) :]
        return out

    def abort(self, request_id: str) -> bool:
        """Drop the request's rows before the next step (any thread); False when it is not in the set."""
        self.engine.abort_request(request_id)
        with self._lock:
            self._done.pop(request_id, None)
            self._totals.pop(request_id, None)
            return self._outputs.pop(request_id, None) is not None

    def progress(self) -> dict[str, tuple[int, int]]:
        """Request id -> (denoiser calls done, of total) for every request in the set: its rows' (they step
        together); a finished request not yet output is at its total."""
        with self._lock:
            progress = {rid: (total, total) for rid, total in self._totals.items()}
        for row in self.engine.progress():
            if row.request_id in progress:
                progress[row.request_id] = (min(row.step, progress[row.request_id][0]), row.total)
        return progress
