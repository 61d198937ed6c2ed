"""422 answers that are always valid JSON, whatever the client sent.

FastAPI's own handler echoes each error's ``input`` (and ``ctx``) as they are. Python's ``json`` accepts the
tokens ``NaN``, ``Infinity`` and ``-Infinity`` and ``\\ud800``-style lone surrogates, so the echo can hold values
that Starlette's ``JSONResponse`` refuses to encode, and a bad request would become a 500. This handler keeps
FastAPI's ``detail`` format (``type``, ``loc``, ``msg``, ``input``, ``ctx``) and makes every value JSON-safe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

MAX_DEPTH = 32
"""Containers nested deeper than this are echoed as ``CUT`` (the encoder and ``repr`` recurse too)."""
CUT = "..."


def _float(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _text(value: str) -> str:
    """``value`` if it encodes to UTF-8, else with its lone surrogates written as ``\\udXXX`` escapes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` with nothing ``json.dumps(allow_nan=False)`` or a UTF-8 encoder would refuse.

    Non-finite floats become ``"NaN"``, ``"Infinity"``, ``"-Infinity"``; bytes are decoded (invalid sequences
    replaced); lone surrogates are escaped; tuples and sets become lists; exceptions become their message;
    other objects go through FastAPI's ``jsonable_encoder`` and, where it fails, become their ``repr``.
    """
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, BaseException):
        return _text(str(value))
    if depth >= MAX_DEPTH and isinstance(value, Mapping | list | tuple | set | frozenset):
        return CUT
    if isinstance(value, Mapping):
        return {_key(key): json_safe(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(item, depth + 1) for item in value]
    try:
        encoded = jsonable_encoder(value)
    except Exception:
        return _text(repr(value))
    if isinstance(encoded, str | int | float | bool | list | dict) or encoded is None:
        return json_safe(encoded, depth + 1)
    return _text(repr(value))


def _key(key: Any) -> str:
    safe = json_safe(key, MAX_DEPTH)
    return safe if isinstance(safe, str) else str(safe)


async def validation_error_response(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 ``{"detail": [...]}``, with every error made JSON-safe."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return JSONResponse({"detail": json_safe(list(errors))}, status_code=422)
