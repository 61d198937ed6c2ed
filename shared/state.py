"""Reading a request's Redis hash (see ``shared.keys``) back into a ``RequestState``."""

from __future__ import annotations

from collections.abc import Mapping

from shared.contracts import ErrorInfo, RequestSpec, RequestState, RequestStatus


def _float(raw: Mapping[str, str], field: str) -> float | None:
    value = raw.get(field)
    return float(value) if value not in (None, "") else None


def _int(raw: Mapping[str, str], field: str, default: int = 0) -> int:
    value = raw.get(field)
    return int(value) if value not in (None, "") else default


STATE_FIELDS: tuple[str, ...] = (
    "spec",
    "status",
    "batch_id",
    "batch_size",
    "step",
    "total",
    "error_type",
    "error_message",
    "results",
    "evicted_at",
    "worker",
    "scheduled_at",
    "started_at",
    "finished_at",
)
"""The hash fields ``parse_state`` reads: fetch these (HMGET), never the whole hash, which may hold input images."""


def parse_state(raw: Mapping[str, str]) -> RequestState:
    """The state stored in a request hash; ``raw`` must hold at least ``spec`` and ``status``."""
    error = None
    if raw.get("error_type"):
        error = ErrorInfo(type=raw["error_type"], message=raw.get("error_message", ""))
    batch_size = raw.get("batch_size")
    return RequestState(
        spec=RequestSpec.model_validate_json(raw["spec"]),
        status=RequestStatus(raw["status"]),
        batch_id=raw.get("batch_id") or None,
        batch_size=int(batch_size) if batch_size else None,
        step=_int(raw, "step"),
        total=_int(raw, "total"),
        error=error,
        result_keys=tuple(raw.get("results", "").split()),
        results_evicted_at=_float(raw, "evicted_at"),
        worker=raw.get("worker") or None,
        scheduled_at=_float(raw, "scheduled_at"),
        started_at=_float(raw, "started_at"),
        finished_at=_float(raw, "finished_at"),
    )
