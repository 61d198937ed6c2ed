"""Bounds on the encoded outputs a worker writes: per request (``max_request_output_bytes``) and per batch
(``max_batch_output_bytes``).

A request's outputs (its images; a video's MP4 and its frames) are only known in size once encoded, so the bounds
are checked then, before anything of the request is stored: a request over its own bound, or whose outputs would
take its batch past the batch's, fails alone with ``OutputTooLarge`` (``ResultWriter.store_results``); the batch's
requests are stored in order, so those stored before it keep theirs. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

OUTPUT_TOO_LARGE = "OutputTooLarge"
"""The error type of a request whose encoded outputs exceed a bound."""


@dataclass(frozen=True, slots=True)
class OutputBounds:
    """The two bounds, in bytes; None: unbounded (a runner's own tests)."""

    per_request: int | None = None
    per_batch: int | None = None

    def budget(self) -> OutputBudget:
        """A fresh tally of one batch's outputs under these bounds."""
        return OutputBudget(self)


@dataclass(slots=True)
class OutputBudget:
    """What one batch has stored so far, against its ``bounds``."""

    bounds: OutputBounds
    stored: int = field(default=0)

    def take(self, size: int) -> str | None:
        """Count ``size`` encoded bytes of the next request and None when they fit; else why not (nothing counted)."""
        limit = self.bounds.per_request
        if limit is not None and size > limit:
            return f"its outputs encode to {size} bytes; this server's max_request_output_bytes is {limit}"
        limit = self.bounds.per_batch
        if limit is not None and self.stored + size > limit:
            return (
                f"its outputs encode to {size} bytes, which would take its batch's outputs to {self.stored + size} "
                f"bytes; this server's max_batch_output_bytes is {limit}"
            )
        self.stored += size
        return None
