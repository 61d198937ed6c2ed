"""Logging of every fusefleet process: plain text or JSON lines (``Settings.log_format``), each line carrying the
request, batch and worker it concerns.

Which ids a line carries comes, in this order, from the log call's ``extra`` (``log.info(..., extra=ids(
batch_id=b))``), from the ids bound with ``log_context`` in the code running (context variables: they follow
asyncio tasks, not threads; ``carry_context`` hands them to another thread), and from the process's own
(``configure_logging(..., worker=...)``). A JSON line is one object: ``time`` (UTC, ISO 8601), ``level``,
``logger``, ``message``, then ``service``, ``worker``, ``batch_id``, ``request_id`` and ``request_ids`` where
known, and ``exception`` (the formatted traceback) when there is one. A text line is
``<time> <LEVEL> <logger>: <message>`` followed by `` [batch_id=... worker=...]`` where known.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Literal, ParamSpec, TextIO, TypeVar

LogFormat = Literal["text", "json"]
FIELDS = ("service", "worker", "batch_id", "request_id", "request_ids")
"""The ids a line can carry, in the order they are written."""

_NONE: Mapping[str, Any] = MappingProxyType({})
_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar("fusefleet_log_context", default=_NONE)
_process: dict[str, Any] = {}  # ids of the whole process (service, worker): every thread's lines carry them

_P = ParamSpec("_P")
_R = TypeVar("_R")


def ids(
    *,
    request_id: str | None = None,
    batch_id: str | None = None,
    worker: str | None = None,
    request_ids: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ids given, for a log call's ``extra`` (ids left None are left out)."""
    given = {"request_id": request_id, "batch_id": batch_id, "worker": worker, "request_ids": request_ids}
    return {name: list(value) if name == "request_ids" else value for name, value in given.items() if value}


@contextmanager
def log_context(
    *,
    request_id: str | None = None,
    batch_id: str | None = None,
    worker: str | None = None,
    request_ids: Sequence[str] | None = None,
) -> Iterator[None]:
    """Every line logged inside (by this thread or asyncio task) carries these ids as well."""
    token = _context.set(
        {**_context.get(), **ids(request_id=request_id, batch_id=batch_id, worker=worker, request_ids=request_ids)}
    )
    try:
        yield
    finally:
        _context.reset(token)


def bind_context(**values: Any) -> contextvars.Token[Mapping[str, Any]]:
    """``log_context`` without the block: bind ids until ``unbind_context(token)`` (for begin/end hooks)."""
    return _context.set({**_context.get(), **{name: value for name, value in values.items() if value}})


def unbind_context(token: contextvars.Token[Mapping[str, Any]]) -> None:
    _context.reset(token)


def carry_context(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """``function`` run, wherever it is called (another thread), with the ids bound where this was called."""
    context = contextvars.copy_context()

    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        return context.run(function, *args, **kwargs)

    return run


class ContextFilter(logging.Filter):
    """Sets each record's ids: its own ``extra`` first, then the context's, then the process's."""

    def filter(self, record: logging.LogRecord) -> bool:
        bound = _context.get()
        for name in FIELDS:
            if getattr(record, name, None) is None:
                value = bound.get(name, _process.get(name))
                if value is not None:
                    setattr(record, name, value)
        return True


def record_ids(record: logging.LogRecord) -> dict[str, Any]:
    return {name: value for name in FIELDS if (value := getattr(record, name, None)) is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module's docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **record_ids(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger>: <message> [batch_id=... worker=...]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        found = {name: value for name, value in record_ids(record).items() if name != "service"}
        if not found:
            return text
        suffix = " ".join(f"{name}={','.join(v) if isinstance(v, list) else v}" for name, v in found.items())
        first, newline, rest = text.partition("\n")  # after the message, before any traceback
        return f"{first} [{suffix}]{newline}{rest}"


def formatter(log_format: LogFormat) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else TextFormatter()


def configure_logging(
    level: str | int,
    log_format: LogFormat,
    *,
    service: str | None = None,
    worker: str | None = None,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send the root logger's records (every logger's, unless one stops propagation) to ``stream`` (stderr) in
    ``log_format``, each carrying ``service`` and ``worker`` besides the ids of its context; replaces the root's
    handlers. Returns the handler."""
    set_process_ids(service=service, worker=worker)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(log_format))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    logging.captureWarnings(True)  # warnings become records of logger py.warnings, in the same format
    return handler


def set_process_ids(*, service: str | None = None, worker: str | None = None) -> None:
    """Ids every line of this process carries (those given; the others stay as they were)."""
    _process.update({name: value for name, value in (("service", service), ("worker", worker)) if value})
