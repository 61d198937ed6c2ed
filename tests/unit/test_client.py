"""``fusefleet.client`` against the real FastAPI app in-process on fakeredis (with Lua).

``AsyncClient`` talks to the app through ``httpx.ASGITransport``; ``Client`` through ``PortalTransport``, which
runs the app (and its lifespan) on an anyio blocking portal's event loop. A worker finishing a request is
simulated with the worker's own ``FINISH`` script, as tests/unit/test_api.py does.
"""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import fakeredis
import httpx
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastapi import FastAPI
from PIL import Image
from typer.testing import CliRunner

from api.app import create_app
from fusefleet.cli import cli
from fusefleet.client import (
    ApiError,
    ApiUnreachable,
    AsyncClient,
    Client,
    Conflict,
    NotFound,
    OutputFormat,
    QueueFull,
    RequestFailed,
    RequestRejected,
    RequestStatus,
    Result,
    Unavailable,
    WaitTimeout,
    build_request,
    encode_image,
)
from fusefleet.client_cli import GenerateOptions, parse_size, request_params
from shared.contracts import RequestSpec
from shared.keys import RedisKeys
from shared.results import ResultStore
from shared.settings import Settings
from shared.wire import GenerateRequest, RequestView
from tests.support.api import fake_results, finish_like_worker
from tests.support.redis_server import free_port
from tests.support.scripted import scripted

pytestmark = pytest.mark.anyio

EXPLODE = "explode"
HAS_IMAGE_FIELDS = "image" in GenerateRequest.model_fields
needs_image_fields = pytest.mark.skipif(
    not HAS_IMAGE_FIELDS, reason="GenerateRequest has no image fields yet (image-conditioned requests)"
)


def png(width: int = 8, height: int = 8, color: tuple[int, int, int] = (200, 30, 30), fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format=fmt)
    return buffer.getvalue()


# --- the app on fakeredis, and a stand-in for the worker ---------------------------------------------------------
@dataclass
class Fleet:
    """The app's Redis (fakeredis) and keys; ``finish`` and ``worker`` act as a GPU worker would."""

    app: FastAPI
    redis: fakeredis.FakeAsyncRedis
    binary: fakeredis.FakeAsyncRedis
    server: fakeredis.FakeServer
    keys: RedisKeys
    settings: Settings
    results: ResultStore

    async def queued_specs(self) -> list[RequestSpec]:
        entries = cast(list[tuple[str, dict[str, str]]], await self.redis.xrange(self.keys.requests))
        return [RequestSpec.model_validate_json(fields["spec"]) for _, fields in entries]

    async def run(self, request_id: str, step: int, total: int) -> None:
        """What CLAIM and PROGRESS leave behind: running under a claim, at ``step`` of ``total``."""
        await self.redis.hset(
            self.keys.request(request_id),
            mapping={"status": "running", "claim": "c1", "step": step, "total": total, "started_at": time.time()},
        )

    async def finish(
        self, request_id: str, outcome: str = "succeeded", images: list[bytes] | None = None, error: str = ""
    ) -> str:
        """End a request with the worker's FINISH script (``error``: ``Type: message`` for a failure)."""
        if await self.redis.hget(self.keys.request(request_id), "status") != "running":
            await self.run(request_id, 0, 4)
        error_type, _, message = error.partition(": ")
        return await finish_like_worker(
            self.redis, self.results, self.keys, request_id, outcome, images or [], (error_type, message)
        )

    async def worker(self, done: set[str]) -> None:
        """Finish every request that shows up: images of its size in its ``output_format``, or ``ValueError``
        when its prompt says so."""
        while True:
            for spec in await self.queued_specs():
                if spec.id in done:
                    continue
                done.add(spec.id)
                await self.run(spec.id, 2, spec.num_inference_steps)
                if EXPLODE in spec.prompt:
                    await self.finish(spec.id, "failed", error=f"ValueError: request {spec.id} asked to {EXPLODE}")
                else:
                    color = (len(done) * 40 % 256, 0, 0)
                    image = png(spec.width, spec.height, color, fmt=spec.output_format.value.upper())
                    await self.finish(spec.id, images=[image] * spec.n)
            await anyio.sleep(0.01)


def _fleet(settings: Settings) -> Fleet:
    server = fakeredis.FakeServer()
    redis = fakeredis.FakeAsyncRedis(server=server, decode_responses=True)
    binary = fakeredis.FakeAsyncRedis(server=server, decode_responses=False)
    results = fake_results(server, settings)
    app = create_app(settings, redis=redis, results=results)
    return Fleet(app, redis, binary, server, RedisKeys(settings.key_prefix), settings, results)


@asynccontextmanager
async def async_served(settings: Settings, **client_options: Any) -> AsyncIterator[tuple[AsyncClient, Fleet]]:
    fleet = _fleet(settings)
    async with fleet.app.router.lifespan_context(fleet.app):
        transport = httpx.ASGITransport(app=fleet.app)
        async with AsyncClient("http://api", transport=transport, **client_options) as client:
            yield client, fleet
    await fleet.redis.aclose()
    await fleet.binary.aclose()


class PortalTransport(httpx.BaseTransport):
    """A sync httpx transport that serves requests with an ASGI app running on ``portal``'s event loop."""

    def __init__(self, portal: BlockingPortal, app: FastAPI) -> None:
        self.portal = portal
        self.asgi = httpx.ASGITransport(app=app)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def call() -> httpx.Response:
            response = await self.asgi.handle_async_request(request)
            content = await response.aread()
            return httpx.Response(response.status_code, headers=response.headers, content=content, request=request)

        return self.portal.call(call)


@dataclass
class SyncServed:
    client: Client
    fleet: Fleet
    portal: BlockingPortal

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run a coroutine function of the fleet on the app's event loop."""
        return self.portal.call(fn, *args)


@contextmanager
def sync_served(settings: Settings, **client_options: Any) -> Iterator[SyncServed]:
    with start_blocking_portal(backend="asyncio") as portal:
        fleet = _fleet(settings)
        with portal.wrap_async_context_manager(fleet.app.router.lifespan_context(fleet.app)):
            transport = PortalTransport(portal, fleet.app)
            with Client("http://api", transport=transport, **client_options) as client:
                yield SyncServed(client, fleet, portal)
        portal.call(fleet.redis.aclose)
        portal.call(fleet.binary.aclose)


@pytest.fixture
async def served(settings: Settings) -> AsyncIterator[tuple[AsyncClient, Fleet]]:
    async with async_served(settings, submit_retries=0) as pair:
        yield pair


# --- import hygiene ----------------------------------------------------------------------------------------------
def test_client_import_loads_no_app_code() -> None:
    code = (
        "import sys; import fusefleet.client; "
        "bad = [m for m in ('fastapi', 'starlette', 'api.app', 'api.routes', 'api.store', 'redis', 'celery', "
        "'torch', 'PIL') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# --- submit, get, validation -------------------------------------------------------------------------------------
async def test_submit_takes_a_model_a_dict_kwargs_or_a_prompt(served: tuple[AsyncClient, Fleet]) -> None:
    client, fleet = served
    ids = [
        await client.submit(GenerateRequest(prompt="a cat", seed=1)),
        await client.submit({"prompt": "a dog", "n": 2}),
        await client.submit(prompt="an owl", width=128),
        await client.submit("a bee", negative_prompt="blurry"),
        await client.submit(GenerateRequest(prompt="a cow"), seed=9),  # kwargs replace fields
    ]
    assert len(set(ids)) == 5
    specs = {spec.id: spec for spec in await fleet.queued_specs()}
    assert [specs[i].prompt for i in ids] == ["a cat", "a dog", "an owl", "a bee", "a cow"]
    assert (specs[ids[0]].seed, specs[ids[1]].n, specs[ids[2]].width) == (1, 2, 128)
    assert (specs[ids[3]].negative_prompt, specs[ids[4]].seed) == ("blurry", 9)

    view = await client.get(ids[1])
    assert isinstance(view, RequestView)
    assert (view.id, view.status, view.params.prompt, view.params.n) == (ids[1], RequestStatus.QUEUED, "a dog", 2)
    assert (view.progress.step, view.progress.total) == (0, 4)


async def test_invalid_request_is_refused_before_sending_naming_the_field(served: tuple[AsyncClient, Fleet]) -> None:
    client, fleet = served
    with pytest.raises(RequestRejected) as caught:
        await client.submit(prompt="a cat", width=63)
    assert caught.value.field == "width"
    assert caught.value.status_code is None
    assert "multiple of 8" in str(caught.value)
    assert caught.value.errors[0].loc == ("body", "width")
    with pytest.raises(RequestRejected) as caught:
        await client.submit({"prompt": ["a cat", "a dog"]})
    assert caught.value.field == "prompt" and "own request" in caught.value.message
    with pytest.raises(RequestRejected) as caught:
        await client.submit(prompt="a cat", colour="red")
    assert caught.value.field == "colour"
    assert await fleet.queued_specs() == []


async def test_api_422_is_request_rejected_naming_the_field(served: tuple[AsyncClient, Fleet]) -> None:
    client, fleet = served
    with pytest.raises(RequestRejected) as caught:
        await client.submit(prompt="a cat", width=1024)  # valid locally, over this server's max_image_side
    assert caught.value.status_code == 422
    assert caught.value.field == "width"
    assert "max_image_side" in str(caught.value)
    with pytest.raises(RequestRejected) as caught:
        await client.submit(prompt="a cat", lora={"name": "nope"})
    assert caught.value.field == "lora.name"
    assert "Unknown LoRA adapter 'nope'" in caught.value.message
    assert await fleet.queued_specs() == []


async def test_full_queue_is_queue_full_with_retry_after(served: tuple[AsyncClient, Fleet]) -> None:
    client, fleet = served
    for i in range(fleet.settings.max_queue_len):
        await client.submit(f"cat {i}")
    with pytest.raises(QueueFull) as caught:
        await client.submit("one too many")
    assert caught.value.status_code == 503
    assert caught.value.retry_after == 5
    assert isinstance(caught.value, Unavailable)
    assert len(await fleet.queued_specs()) == fleet.settings.max_queue_len


async def test_redis_down_is_unavailable_not_queue_full(served: tuple[AsyncClient, Fleet]) -> None:
    client, fleet = served
    fleet.server.connected = False
    with pytest.raises(Unavailable) as caught:
        await client.submit("a cat")
    assert not isinstance(caught.value, QueueFull)
    assert caught.value.retry_after == 5 and "unavailable" in caught.value.message
    with pytest.raises(Unavailable):
        await client.get("0123456789abcdef" * 2)  # well-formed: a malformed id is a 404 unasked


async def test_unknown_request_is_not_found(served: tuple[AsyncClient, Fleet]) -> None:
    client, _ = served
    for call in (client.get("nope"), client.abort("nope"), client.image("nope", 0), client.wait("nope")):
        with pytest.raises(NotFound) as caught:
            await call
        assert caught.value.status_code == 404


async def test_abort(served: tuple[AsyncClient, Fleet]) -> None:
    client, fleet = served
    queued = await client.submit("a cat")
    assert await client.abort(queued) is RequestStatus.ABORTED
    assert await client.abort(queued) is RequestStatus.ABORTED  # idempotent
    running = await client.submit("a dog")
    await fleet.run(running, 1, 4)
    assert await client.abort(running) is RequestStatus.RUNNING  # its worker winds it down
    assert await fleet.finish(running, images=[png()]) == "aborted"  # the flag wins over success
    done = await client.submit("an owl")
    await fleet.finish(done, images=[png()])
    assert await client.abort(done) is RequestStatus.SUCCEEDED  # too late: 409, reported as its status


async def test_delete(served: tuple[AsyncClient, Fleet]) -> None:
    client, fleet = served
    with pytest.raises(NotFound):
        await client.delete("nope")
    queued = await client.submit("a cat")
    with pytest.raises(Conflict) as caught:
        await client.delete(queued)
    assert caught.value.status_code == 409 and "abort" in caught.value.message
    assert (await client.get(queued)).status is RequestStatus.QUEUED  # left alone
    assert await client.abort(queued) is RequestStatus.ABORTED
    assert await client.delete(queued) is None
    with pytest.raises(NotFound):
        await client.get(queued)

    done = await client.submit("a dog")
    await fleet.finish(done, images=[png()])
    assert await client.image(done, 0) == png()
    await client.delete(done)
    for call in (client.get(done), client.image(done, 0), client.delete(done)):
        with pytest.raises(NotFound):
            await call


# --- wait ---------------------------------------------------------------------------------------------------------
async def test_wait_long_polls_until_the_worker_finishes(served: tuple[AsyncClient, Fleet]) -> None:
    client, fleet = served
    rid = await client.submit("a cat", n=2)
    images = [png(color=(1, 2, 3)), png(color=(4, 5, 6))]

    async def finish_soon() -> None:
        await anyio.sleep(0.3)
        await fleet.finish(rid, images=images)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(finish_soon)
        started = time.monotonic()
        view = await client.wait(rid, timeout=20)
        elapsed = time.monotonic() - started
    assert view.status is RequestStatus.SUCCEEDED
    assert 0.2 < elapsed < 5, elapsed  # woken by the finish, not by a poll interval or the timeout
    assert await client.images(rid) == images
    assert await client.image(rid, 1) == images[1]
    with pytest.raises(NotFound):
        await client.image(rid, 2)


async def test_wait_reports_progress(served: tuple[AsyncClient, Fleet]) -> None:
    client, fleet = served
    rid = await client.submit("a cat", num_inference_steps=4)
    seen: list[tuple[str, int, int]] = []

    async def on_progress(view: RequestView) -> None:  # a coroutine function is awaited
        seen.append((view.status.value, view.progress.step, view.progress.total))

    async def work() -> None:
        await anyio.sleep(0.15)
        for step in (1, 2, 3):
            await fleet.run(rid, step, 4)
            await anyio.sleep(0.5)  # ten polls' worth: a loaded machine still sees every step
        await fleet.finish(rid, "failed", error="RuntimeError: out of luck")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(work)
        view = await client.wait(rid, timeout=20, on_progress=on_progress, poll_interval=0.05)
    assert view.status is RequestStatus.FAILED
    assert view.error is not None and (view.error.type, view.error.message) == ("RuntimeError", "out of luck")
    assert seen[0] == ("queued", 0, 4)
    assert ("running", 2, 4) in seen
    assert seen[-1][0] == "failed"
    assert len(seen) < 60, "polls at the interval, not in a busy loop"


async def test_wait_timeout_reports_the_last_state(served: tuple[AsyncClient, Fleet]) -> None:
    client, fleet = served
    rid = await client.submit("a cat")
    await fleet.run(rid, 3, 4)
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as caught:
        await client.wait(rid, timeout=0.3)
    assert 0.25 < time.monotonic() - started < 5
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.view is not None and caught.value.view.status is RequestStatus.RUNNING
    assert caught.value.view.progress.step == 3


# --- generate -----------------------------------------------------------------------------------------------------
async def test_generate_runs_each_request_on_its_own(served: tuple[AsyncClient, Fleet]) -> None:
    client, fleet = served
    requests: list[Any] = [
        "a red fox",
        {"prompt": "a bad size", "width": 63},  # refused by the client
        GenerateRequest(prompt="too wide", width=1024),  # refused by the api (max_image_side)
        {"prompt": f"please {EXPLODE}"},  # fails in the worker
        {"prompt": "a blue whale", "n": 2, "width": 32},
    ]
    done: set[str] = set()
    progress: list[tuple[int, str]] = []
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(fleet.worker, done)
        results = await client.generate(
            requests,
            timeout=20,
            on_progress=lambda i, view: progress.append((i, view.status.value)),
            height=32,
            seed=5,
        )
        tasks.cancel_scope.cancel()

    assert [r.index for r in results] == [0, 1, 2, 3, 4]
    fox, bad_size, too_wide, exploded, whale = results
    for good, n in ((fox, 1), (whale, 2)):
        assert good.ok and good.error is None and good.id is not None
        assert good.status is RequestStatus.SUCCEEDED
        assert good.view is not None and good.view.params.seed == 5  # the defaults apply
        assert len(good.images) == n
        assert [image.size for image in good.pil_images()] == [(good.view.params.width, 32)] * n
    assert fox.pil_images()[0].size == (64, 32) and whale.pil_images()[0].size == (32, 32)

    assert bad_size.id is None and bad_size.status is None and bad_size.request is None
    assert bad_size.error is not None and bad_size.error.type == "RequestRejected"
    assert bad_size.error.field == "width" and "multiple of 8" in bad_size.error.message

    assert too_wide.id is None and too_wide.status is None and too_wide.request is not None
    assert too_wide.error is not None and too_wide.error.field == "width"
    assert "max_image_side" in too_wide.error.message

    assert exploded.id is not None and exploded.status is RequestStatus.FAILED and exploded.images == []
    assert exploded.error is not None and exploded.error.type == "ValueError"
    assert EXPLODE in exploded.error.message and exploded.id in exploded.error.message
    with pytest.raises(RequestFailed, match="ValueError"):
        exploded.raise_for_error()
    assert fox.raise_for_error() is fox

    assert {spec.prompt for spec in await fleet.queued_specs()} == {"a red fox", "please explode", "a blue whale"}
    assert {i for i, _ in progress} == {0, 3, 4}


async def test_generate_with_output_format(served: tuple[AsyncClient, Fleet], tmp_path: Path) -> None:
    client, fleet = served
    done: set[str] = set()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(fleet.worker, done)
        results = await client.generate(
            ["a red fox", {"prompt": "a blue whale", "output_format": "webp"}, "a grey owl"],
            timeout=20,
            output_format="jpeg",
            output_compression=70,
        )
        tasks.cancel_scope.cancel()
    fox, whale, owl = results
    assert fox.ok and whale.ok and owl.ok
    specs = {spec.id: spec for spec in await fleet.queued_specs()}
    assert [(specs[str(r.id)].output_format, specs[str(r.id)].output_compression) for r in results] == [
        (OutputFormat.JPEG, 70),
        (OutputFormat.WEBP, 70),  # the request's own format, the defaults' quality
        (OutputFormat.JPEG, 70),
    ]
    assert [r.output_format for r in results] == [OutputFormat.JPEG, OutputFormat.WEBP, OutputFormat.JPEG]
    assert [r.pil_images()[0].format for r in results] == ["JPEG", "WEBP", "JPEG"]
    assert [p.name for p in fox.save(tmp_path)] == [f"{fox.id}-0.jpeg"]
    assert [p.name for p in whale.save(tmp_path, "whale")] == ["whale-0.webp"]
    assert Image.open(tmp_path / "whale-0.webp").format == "WEBP"


async def test_generate_timeout_leaves_the_request_running(served: tuple[AsyncClient, Fleet]) -> None:
    client, _ = served
    [result] = await client.generate(["nobody runs this"], timeout=0.2)
    assert result.id is not None and result.status is RequestStatus.QUEUED
    assert result.error is not None and result.error.type == "WaitTimeout"
    assert (await client.get(result.id)).status is RequestStatus.QUEUED


async def test_generate_takes_a_list(served: tuple[AsyncClient, Fleet]) -> None:
    client, _ = served
    for one in ("a cat", {"prompt": "a cat"}, GenerateRequest(prompt="a cat")):
        with pytest.raises(TypeError, match="list of requests"):
            await client.generate(one)  # type: ignore[arg-type]
    assert await client.generate([]) == []


# --- the sync client ----------------------------------------------------------------------------------------------
def test_sync_client(settings: Settings) -> None:
    with sync_served(settings, submit_retries=0) as served:
        client, fleet = served.client, served.fleet
        rid = client.submit("a cat", n=2)
        assert client.get(rid).status is RequestStatus.QUEUED
        images = [png(color=(9, 9, 9)), png(color=(8, 8, 8))]
        assert served.call(fleet.finish, rid, "succeeded", images) == "succeeded"
        view = client.wait(rid, timeout=10)
        assert view.status is RequestStatus.SUCCEEDED and len(view.images) == 2
        assert client.images(rid) == images and client.image(rid, 0) == images[0]
        assert client.abort(rid) is RequestStatus.SUCCEEDED
        aborted = client.submit("a dog")
        assert client.abort(aborted) is RequestStatus.ABORTED
        client.delete(aborted)
        with pytest.raises(NotFound):
            client.delete(aborted)
        with pytest.raises(Conflict):
            client.delete(client.submit("a bee"))
        client.delete(rid)
        with pytest.raises(NotFound):
            client.image(rid, 0)
        with pytest.raises(RequestRejected) as caught:
            client.submit(prompt="a cat", num_inference_steps=51)
        assert caught.value.status_code == 422 and caught.value.field == "num_inference_steps"
        with pytest.raises(NotFound):
            client.get("nope")
        with pytest.raises(WaitTimeout):
            client.wait(client.submit("an owl"), timeout=0.1)


def test_sync_generate_submits_in_order_and_isolates_failures(settings: Settings) -> None:
    with sync_served(settings) as served:
        done: set[str] = set()
        worker = served.portal.start_task_soon(served.fleet.worker, done)
        try:
            results = served.client.generate(
                ["first", {"prompt": "second", "steps": 4}, f"third, {EXPLODE}", "fourth"], timeout=20
            )
        finally:
            worker.cancel()
        specs = served.call(served.fleet.queued_specs)
    assert [spec.prompt for spec in specs] == ["first", f"third, {EXPLODE}", "fourth"]  # in order
    assert [r.status for r in results] == [
        RequestStatus.SUCCEEDED,
        None,
        RequestStatus.FAILED,
        RequestStatus.SUCCEEDED,
    ]
    assert results[1].error is not None and results[1].error.field == "steps"  # no such field
    assert results[2].error is not None and results[2].error.type == "ValueError"
    assert [r.id for r in results if r.id] == [spec.id for spec in specs]
    assert all(len(r.images) == 1 for r in (results[0], results[3]))


# --- retries and unexpected answers (a scripted transport) ----------------------------------------------------------
def _queue_full(retry_after: str = "7") -> httpx.Response:
    detail = {"detail": "the request queue is full; retry later"}
    return httpx.Response(503, json=detail, headers={"Retry-After": retry_after})


def test_submit_retries_503_after_retry_after() -> None:
    transport, seen = scripted([_queue_full("0"), _queue_full("0"), httpx.Response(202, json={"id": "r1"})])
    with Client("http://api", transport=transport, submit_retries=3) as client:
        assert client.submit("a cat") == "r1"
    assert len(seen) == 3


def test_submit_retries_are_bounded() -> None:
    transport, seen = scripted([_queue_full("7")])
    with Client("http://api", transport=transport, submit_retries=2, max_retry_wait_s=0.01) as client:
        started = time.monotonic()
        with pytest.raises(QueueFull) as caught:
            client.submit("a cat")
    assert len(seen) == 3 and time.monotonic() - started < 2  # each wait capped at max_retry_wait_s
    assert caught.value.retry_after == 7


def test_submit_retries_a_409_of_its_key_in_progress_under_the_same_key() -> None:
    detail = {"detail": "a submission with this key is in progress"}
    in_progress = httpx.Response(409, json=detail, headers={"Retry-After": "0"})
    transport, seen = scripted([in_progress, httpx.Response(202, json={"id": "r1"})])
    with Client("http://api", transport=transport, submit_retries=2) as client:
        assert client.submit("a cat") == "r1"
    assert len(seen) == 2 and seen[0].headers["Idempotency-Key"] == seen[1].headers["Idempotency-Key"]
    transport, seen = scripted([httpx.Response(409, json={"detail": "no Retry-After: not a key's"})])
    with Client("http://api", transport=transport, submit_retries=2) as client, pytest.raises(Conflict):
        client.submit("a cat")
    assert len(seen) == 1


async def test_async_submit_retries_503() -> None:
    answers = [_queue_full("0"), httpx.Response(202, json={"id": "r2"})]
    transport = httpx.MockTransport(lambda request: answers.pop(0))
    async with AsyncClient("http://api", transport=transport) as client:
        assert await client.submit("a cat") == "r2"
    assert answers == []


def test_unexpected_answers_are_api_errors() -> None:
    transport, _ = scripted([httpx.Response(502, text="bad gateway")])
    with Client("http://api", transport=transport) as client, pytest.raises(ApiError) as caught:
        client.get("r1")
    assert caught.value.status_code == 502 and "bad gateway" in str(caught.value)
    transport, _ = scripted([httpx.Response(200, json={"not": "a view"})])
    with Client("http://api", transport=transport) as client, pytest.raises(ApiError, match="unexpected answer"):
        client.get("r1")


def test_unreachable_api() -> None:
    with Client(f"http://127.0.0.1:{free_port()}", timeout=5) as client, pytest.raises(ApiUnreachable) as caught:
        client.submit("a cat")
    assert "127.0.0.1" in str(caught.value)


def test_base_url_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSEFLEET_URL", "http://fleet.example:9000/")
    with Client() as client:
        assert client.base_url == "http://fleet.example:9000"
    monkeypatch.delenv("FUSEFLEET_URL")
    with Client() as client:
        assert client.base_url == "http://127.0.0.1:8000"


# --- images -------------------------------------------------------------------------------------------------------
def test_encode_image_sources(tmp_path: Path) -> None:
    data = png(16, 8)
    path = tmp_path / "in.png"
    path.write_bytes(data)
    expected = base64.b64encode(data).decode()
    assert encode_image(path) == expected
    assert encode_image(str(path)) == expected
    assert encode_image(data) == expected
    with path.open("rb") as handle:
        assert encode_image(handle) == expected
    decoded = Image.open(io.BytesIO(base64.b64decode(encode_image(Image.new("RGB", (16, 8))))))
    assert (decoded.format, decoded.size) == ("PNG", (16, 8))
    jpeg = png(8, 8, fmt="JPEG")
    assert encode_image(jpeg, data_url=True) == "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
    assert encode_image("data:image/png;base64,AAAA") == "data:image/png;base64,AAAA"
    webp = png(8, 8, fmt="WEBP")
    assert encode_image(webp, data_url=True).startswith("data:image/webp;base64,")


def test_encode_image_converts_other_formats_and_refuses_garbage() -> None:
    gif = png(8, 8, fmt="GIF")
    converted = Image.open(io.BytesIO(base64.b64decode(encode_image(gif))))
    assert (converted.format, converted.size) == ("PNG", (8, 8))
    with pytest.raises(ValueError, match="not a readable image"):
        encode_image(b"certainly not an image")
    with pytest.raises(ValueError, match="empty"):
        encode_image(b"")
    with pytest.raises(TypeError):
        encode_image(42)  # type: ignore[arg-type]


def test_pil_images_and_save(tmp_path: Path) -> None:
    result = Result(index=0, request=None, id="abc", status=RequestStatus.SUCCEEDED, images=[png(8, 16), png(16, 8)])
    assert [image.size for image in result.pil_images()] == [(8, 16), (16, 8)]
    paths = result.save(tmp_path / "out")
    assert [p.name for p in paths] == ["abc-0.png", "abc-1.png"]
    assert paths[1].read_bytes() == result.images[1]
    assert [p.name for p in result.save(tmp_path, "fox")] == ["fox-0.png", "fox-1.png"]
    requested = GenerateRequest(prompt="a fox", output_format=OutputFormat.WEBP)
    webp = Result(index=0, request=requested, id="w", status=RequestStatus.SUCCEEDED, images=[png(fmt="WEBP")])
    assert [p.name for p in webp.save(tmp_path)] == ["w-0.webp"]  # no view: the requested format


def test_pil_images_without_pillow_say_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    result = Result(index=0, request=None, id="abc", status=RequestStatus.SUCCEEDED, images=[b"..."])
    with pytest.raises(ImportError, match="needs Pillow.*pip install pillow"):
        result.pil_images()


def test_build_request_defaults_and_overrides() -> None:
    request = build_request({"prompt": "a cat", "seed": 3}, defaults={"seed": 1, "n": 2}, overrides={"width": 32})
    assert (request.seed, request.n, request.width) == (3, 2, 32)
    assert set(request.model_fields_set) == {"prompt", "seed", "n", "width"}


def test_build_request_output_format() -> None:
    request = build_request("a cat", defaults={"output_format": "webp"}, overrides={"output_compression": 80})
    assert (request.output_format, request.output_compression) == (OutputFormat.WEBP, 80)
    assert build_request("a cat").output_format is OutputFormat.PNG
    with pytest.raises(RequestRejected) as caught:
        build_request("a cat", overrides={"output_compression": 80})  # png is lossless
    assert caught.value.field == "output_compression" and caught.value.status_code is None
    with pytest.raises(RequestRejected) as caught:
        build_request("a cat", overrides={"output_format": "gif"})
    assert caught.value.field == "output_format"


@needs_image_fields
async def test_image_conditioned_request(served: tuple[AsyncClient, Fleet], tmp_path: Path) -> None:
    client, fleet = served
    source = tmp_path / "in.png"
    source.write_bytes(png(64, 64, (10, 200, 10)))
    request = GenerateRequest.model_validate(
        {"prompt": "a watercolour fox", "image": encode_image(source), "strength": 0.6}
    )
    rid = await client.submit(request)
    [spec] = await fleet.queued_specs()
    assert spec.id == rid and spec.strength == 0.6
    with pytest.raises(RequestRejected) as caught:
        await client.submit(prompt="a fox", image=base64.b64encode(b"not an image").decode())
    assert caught.value.field == "image"


# --- the CLI without a fleet ----------------------------------------------------------------------------------------
def test_cli_format_and_quality_become_request_fields(tmp_path: Path) -> None:
    opts = GenerateOptions(prompts=["a fox"], out=tmp_path, output_format=OutputFormat.JPEG, quality=80)
    assert request_params(opts) == {"output_format": "jpeg", "output_compression": 80}
    opts = GenerateOptions(prompts=["a fox"], out=tmp_path, output_format=OutputFormat.WEBP)
    assert request_params(opts) == {"output_format": "webp"}
    assert request_params(GenerateOptions(prompts=["a fox"], out=tmp_path)) == {}


def test_parse_size() -> None:
    assert parse_size("512x768") == (512, 768)
    assert parse_size("64") == (64, 64)
    assert parse_size(" 32 X 16 ") == (32, 16)


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--size", "big"], 2, "WIDTHxHEIGHT"),
        (["--mask", "m.png"], 2, "need --image"),
        (["--quality", "50"], 2, "--quality needs --format jpeg or webp"),
        (["--format", "png", "--quality", "50"], 2, "--quality needs --format jpeg or webp"),
        (["--format", "gif"], 2, "'gif' is not one of"),
        (["--format", "jpeg", "--quality", "101"], 2, "--quality"),
        (["--size", "63x64"], 1, "'a fox' was refused: RequestRejected: width: Input should be a multiple of 8"),
        ([], 1, "'a fox' could not be submitted: ApiUnreachable"),
    ],
)
def test_cli_errors_are_readable(args: list[str], code: int, says: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(cli, ["generate", "a fox", "--url", url, "--no-progress", *args])
    output = result.stdout + result.stderr
    assert result.exit_code == code, output
    assert says in " ".join(output.split())
    assert "Traceback" not in output
