"""Schemathesis against a real ``fusefleet api`` process: no operation answers 5xx, whatever it is sent, and the
process is still up afterwards.

The api runs alone on a private Redis-compatible server, under its own key prefix, with no scheduler: submitted
requests simply stay queued (far below ``max_queue_len``, so the 503 "queue full" answer cannot happen here).
Schemathesis sends schema-valid and schema-violating data to every operation (a bounded number of examples each)
and applies all its checks: no server error, documented status codes, content types, headers and response
schemas, valid data accepted and invalid data rejected.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import APIOperation, BaseSchema, Case, GenerationMode
from schemathesis.core.result import Err

from tests.support.processes import Service, wait_for
from tests.support.redis_server import RedisServer, free_port

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

TINY_PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415478da63f8cfc0000003010100"
        "c9fe92ef0000000049454e44ae426082"
    )
).decode()
"""A 1x1 PNG: what a schema-valid ``image`` or ``mask_image`` holds in positive cases (whether a string is a
decodable image is, like the pixel budget, something JSON Schema cannot state)."""

EXAMPLES_PER_OPERATION = 100
"""Per operation and generation mode; the whole module stays well under a minute on two cores."""
BODY_LIMIT = 1024 * 1024


@dataclass
class RunningApi:
    service: Service
    base_url: str


@pytest.fixture(scope="module")
def running_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    tmp = tmp_path_factory.mktemp("api-schema")
    server = RedisServer(tmp / "redis").start()
    port = free_port()
    env = {
        "FUSEFLEET_REDIS_URL": server.url,
        "FUSEFLEET_KEY_PREFIX": f"ff-schema-{uuid.uuid4().hex[:8]}",
        # The pixel budget is the one limit JSON Schema cannot state (a product of fields); with these limits
        # no schema-valid request reaches it (4 x 1024 x 1024 x 1 frame). tests/unit/test_api_input.py covers it.
        "FUSEFLEET_MAX_IMAGE_SIDE": "1024",
        "FUSEFLEET_MAX_IMAGES_PER_REQUEST": "4",
        "FUSEFLEET_MAX_NUM_FRAMES": "1",  # frames multiply the pixels too
        "FUSEFLEET_MAX_BATCH_PIXELS": str(4 * 1024 * 1024),
        "FUSEFLEET_MAX_BODY_BYTES": str(BODY_LIMIT),  # far above any body schemathesis builds
    }
    service = Service.fusefleet("api", ["api", "--port", str(port), "--log-level", "warning"], env, tmp)
    base_url = f"http://127.0.0.1:{port}"
    try:
        service.start()

        def healthy() -> bool:
            assert service.alive(), service.log()
            try:
                return httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, timeout=60, what="the api to answer /healthz")
        yield RunningApi(service, base_url)
    finally:
        service.stop()
        server.stop()


@pytest.fixture(scope="module")
def api_schema(running_api: RunningApi) -> BaseSchema:
    return schemathesis.openapi.from_url(f"{running_api.base_url}/openapi.json")


def _operations(api_schema: BaseSchema) -> list[APIOperation[Any, Any, Any, Any]]:
    operations = []
    for result in api_schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()  # the served schema itself is invalid
        operations.append(result.ok())
    return operations


def test_schema_lists_every_route(api_schema: BaseSchema) -> None:
    labels = {operation.label for operation in _operations(api_schema)}
    assert labels == {
        "POST /v1/requests",
        "POST /v1/requests/batch",
        "GET /v1/requests/{request_id}",
        "GET /v1/requests/{request_id}/images/{index}",
        "GET /v1/requests/{request_id}/videos/{index}",
        "GET /v1/requests/{request_id}/video",
        "DELETE /v1/requests/{request_id}",
        "POST /v1/requests/{request_id}/abort",
        "GET /v1/requests/{request_id}/events",
        "GET /v1/events",
        "GET /v1/fleet",
        "GET /healthz",
    }


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_no_operation_answers_5xx(api_schema: BaseSchema, mode: GenerationMode, subtests: pytest.Subtests) -> None:
    """Every operation, ``EXAMPLES_PER_OPERATION`` cases each, all of schemathesis' checks on every answer."""
    for operation in _operations(api_schema):
        with subtests.test(msg=operation.label):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            def run(case: Case[Any]) -> None:
                if mode is GenerationMode.POSITIVE:
                    _with_real_images(case.body)
                    _with_fresh_idempotency_key(case)
                response = case.call_and_validate(timeout=30)
                assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code}"

            try:
                run()
            except Unsatisfiable:
                # e.g. GET /healthz has no parameters and a free-form string is all abort takes: there is
                # nothing schema-invalid to send
                assert mode is GenerationMode.NEGATIVE
                pytest.skip(f"no schema-invalid request exists for {operation.label}")


def _with_fresh_idempotency_key(case: Case[Any]) -> None:
    """A key of its own for a generated case that sends ``Idempotency-Key``: a key is bound to the first body sent
    with it (another body is a 422), which the schema cannot say, and hypothesis sends the same few keys often."""
    if case.headers and "Idempotency-Key" in case.headers:
        case.headers["Idempotency-Key"] = uuid.uuid4().hex


def _with_real_images(body: object) -> None:
    """Put a real PNG into every non-null image field of a generated request body (single or batch), in place."""
    items = body.get("requests", [body]) if isinstance(body, dict) else []
    for item in items if isinstance(items, list) else []:
        for field in ("image", "mask_image"):
            if isinstance(item, dict) and isinstance(item.get(field), str):
                item[field] = TINY_PNG


def test_real_socket_body_limit(running_api: RunningApi) -> None:
    """413 through uvicorn, for a declared and for a chunked body."""
    big = b'{"prompt": "' + b"x" * (BODY_LIMIT + BODY_LIMIT // 2) + b'"}'

    def chunked() -> Iterator[bytes]:
        for start in range(0, len(big), 64 * 1024):
            yield big[start : start + 64 * 1024]

    with httpx.Client(base_url=running_api.base_url, timeout=30) as http:
        for content in (big, chunked()):
            response = http.post("/v1/requests", content=content, headers={"content-type": "application/json"})
            assert response.status_code == 413, response.text
            assert "max_body_bytes" in response.json()["detail"]
        assert http.get("/healthz").status_code == 200


def test_api_is_still_alive(running_api: RunningApi) -> None:
    """Runs last (pytest keeps the file's order): the process took everything above without a crash."""
    assert running_api.service.alive(), running_api.service.log()
    response = httpx.get(f"{running_api.base_url}/healthz", timeout=5)
    assert response.status_code == 200
    assert "Traceback" not in running_api.service.log(), running_api.service.log()[-4000:]
