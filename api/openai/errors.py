"""Errors of the OpenAI-compatible routes, in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Status codes follow OpenAI's: 400 for an invalid parameter (never 422; ``param`` names it in OpenAI's terms,
e.g. ``size`` for the native ``width``), 401 without a valid API key (``invalid_api_key``, ``missing_api_key``),
404 for a model the fleet does not have, 413 for a body over ``max_body_bytes``, 429 with ``Retry-After`` for an
API key's limit (``rate_limit_exceeded``, ``max_queued_exceeded``), 413 / 429 (``input_bytes_too_large``,
``input_budget_exceeded``, ``param`` = ``image``) past the input budget (``api.input_budget``), 503 with
``Retry-After`` when the queue is full or Redis fails. The outcomes of a generation (failed, aborted, timed out)
are in ``api.openai.generation``.

``OpenAIRoute`` gives these answers to its routes only: the native routes keep the app-wide handlers and their
``{"detail": ...}`` format. ``OpenAIBodyLimitShape`` rewrites the body-limit middleware's 413 for the OpenAI paths.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from fastapi import status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import KeyRefused
from api.input_budget import InputsRefused
from api.outage import StoreUnavailable, retry_after_headers, unavailable_message
from api.validation import json_safe

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

PARAM_OF_FIELD: Mapping[str, str] = {"width": "size", "height": "size", "mask_image": "mask"}
"""Native ``GenerateRequest`` fields whose OpenAI parameter has another name; the others keep theirs."""

OPENAI_PATH_PREFIXES = ("/v1/images/", "/v1/videos")
"""Paths whose 413 (from ``api.body_limit``) is answered in OpenAI's shape."""


class OpenAIError(Exception):
    """An answer in OpenAI's error shape; raised anywhere under an ``OpenAIRoute``. ``kind`` is its ``type``."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        kind: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """``{"error": {...}}``, every value JSON-safe (a param may echo any key the client sent)."""
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        safe: dict[str, Any] = json_safe({"error": error})
        return safe

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def model_not_found(model: str, known: Iterable[str] = ()) -> OpenAIError:
    """404 for a ``model`` that is not one of the fleet's models, ``known`` (OpenAI's own wording and code)."""
    serves = f"this server serves {', '.join(known)}" if known else "this server does not serve it"
    return OpenAIError(
        status.HTTP_404_NOT_FOUND,
        f"The model '{model}' does not exist; {serves} (GET /v1/models)",
        param="model",
        code="model_not_found",
    )


def param_name(loc: Iterable[str | int]) -> str | None:
    """The OpenAI parameter of a validation error's ``loc``: ``("body", "width")`` -> ``"size"``,
    ``("body", "lora", "name")`` -> ``"lora.name"``; None for the body as a whole."""
    parts = [str(part) for part in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    if not parts:
        return None
    parts[0] = PARAM_OF_FIELD.get(parts[0], parts[0])
    return ".".join(parts)


def _describe(error: Mapping[str, Any]) -> tuple[str | None, str, str]:
    """``(param, message, code)`` of one error in FastAPI's 422 ``detail`` format."""
    kind = str(error.get("type", ""))
    param = param_name(error.get("loc", ()))
    msg = str(error.get("msg", "invalid value"))
    if kind == "json_invalid":
        return (
            None,
            f"We could not parse the JSON body of your request ({error.get('ctx', {}).get('error', msg)})",
            ("invalid_json"),
        )
    if param is None:
        return None, f"Invalid request body: {msg}", "invalid_value"
    if kind == "extra_forbidden":
        return param, f"Unknown parameter: '{param}'.", "unknown_parameter"
    if kind == "missing":
        return param, f"Missing required parameter: '{param}'.", "missing_required_parameter"
    if kind.endswith(("_type", "_parsing")) or kind == "prompt_not_string":
        return param, f"Invalid type for '{param}': {msg}", "invalid_type"
    return param, f"Invalid value for '{param}': {msg}", "invalid_value"


def invalid_request(errors: Iterable[Mapping[str, Any]]) -> OpenAIError:
    """One 400 for a list of validation errors: ``param`` and ``code`` of the first, every message in order."""
    described = [_describe(error) for error in errors] or [(None, "Invalid request.", "invalid_value")]
    param, _, code = described[0]
    return OpenAIError(
        status.HTTP_400_BAD_REQUEST, " ".join(message for _, message, _ in described), param=param, code=code
    )


def unavailable(exc: Exception) -> OpenAIError:
    """503 with ``Retry-After``: Redis is down, stalled or loading, or the result store failed."""
    return OpenAIError(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        f"{unavailable_message(exc)}; retry later",
        kind=SERVER_ERROR,
        code="service_unavailable",
        headers=retry_after_headers(),
    )


_CODE_OF_STATUS: Mapping[int, str] = {
    status.HTTP_400_BAD_REQUEST: "invalid_request",
    status.HTTP_404_NOT_FOUND: "not_found",
    status.HTTP_413_CONTENT_TOO_LARGE: "request_too_large",
    status.HTTP_503_SERVICE_UNAVAILABLE: "server_overloaded",  # the one 503 raised as HTTPException: queue full
}


def from_http_exception(exc: HTTPException) -> OpenAIError:
    """An ``HTTPException`` of the shared code (queue full, undecodable form) in OpenAI's shape, same status."""
    return OpenAIError(
        exc.status_code,
        str(exc.detail),
        kind=INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR,
        code=_CODE_OF_STATUS.get(exc.status_code),
        headers=exc.headers,
    )


def as_openai_error(exc: Exception) -> OpenAIError | None:
    """The OpenAI answer to an exception raised under an OpenAI route; None for a bug (a 500 as usual)."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, KeyRefused):  # 401 (no key, unknown key), 429 (a key's limit): its own code
        return OpenAIError(exc.status_code, str(exc.detail), code=exc.code, headers=exc.headers)
    if isinstance(exc, InputsRefused):  # 413, 429 (input budget): its code, the field as OpenAI names it
        return OpenAIError(exc.status_code, exc.message, param=param_name(exc.loc), code=exc.code, headers=exc.headers)
    if isinstance(exc, RequestValidationError):
        return invalid_request(exc.errors())
    if isinstance(exc, StoreUnavailable | RedisError):
        return unavailable(exc)
    if isinstance(exc, HTTPException):
        return from_http_exception(exc)
    return None


class OpenAIRoute(APIRoute):
    """A route whose every error (validation, Redis, HTTPException) is answered in OpenAI's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def openai_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                error = as_openai_error(exc)
                if error is None:
                    raise
                return error.response()

        return openai_handler


class OpenAIBodyLimitShape:
    """Outside ``api.body_limit.BodyLimit``: its 413 ``{"detail": ...}`` becomes OpenAI's shape on the OpenAI
    paths (same status, message and headers); every other answer passes through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(OPENAI_PATH_PREFIXES):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def reshaping_send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] == 413:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                await _send_413(start, b"".join(chunks), send)

        await self.app(scope, receive, reshaping_send)


async def _send_413(start: Message, native_body: bytes, send: Send) -> None:
    try:
        detail = str(json.loads(native_body)["detail"])
    except (ValueError, KeyError, TypeError):
        detail = "request body too large"
    error = OpenAIError(status.HTTP_413_CONTENT_TOO_LARGE, detail, code="request_too_large")
    body = json.dumps(error.body()).encode()
    headers = [(name, value) for name, value in start.get("headers", []) if name.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": body})
