"""Redis down, stalled or loading: every route answers 503 with Retry-After (``/healthz``: ``{"status":
"unavailable"}``) within ``redis_socket_timeout_s``, never a hang or a 500.

The app runs with its real ``redis.asyncio`` clients against sockets that fail the way a Redis does: a closed
port (refused), a listener whose backlog is full (connect hangs), and a small RESP server that answers what the
test says (``-LOADING`` after a restart, or nothing at all).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import httpx
import pytest
from redis import exceptions as redis_errors

from api.app import create_app
from shared.keys import RedisKeys
from shared.results import ResultStoreError
from shared.settings import Settings
from shared.wire import GenerateRequest
from tests.support.api import Api, api_harness, fake_results, unit_settings

pytestmark = pytest.mark.anyio

SOCKET_TIMEOUT_S = 0.5
SLACK_S = 2.0  # scheduling noise of a loaded 2-core machine; still well under the 5 s connect timeout
RID = "0123456789abcdef" * 2
"""A well-formed request id (``api.request_ids``): its routes ask Redis."""
SPEC = GenerateRequest(prompt="a cat").to_spec(request_id=RID, model="demo", seed=1, created_at=1.0)

ROUTES = [
    pytest.param("POST", "/v1/requests", {"prompt": "a cat"}, id="submit"),
    pytest.param("POST", "/v1/requests/batch", {"requests": [{"prompt": "a cat"}]}, id="batch"),
    pytest.param("GET", f"/v1/requests/{RID}", None, id="get"),
    pytest.param("GET", f"/v1/requests/{RID}?wait_s=5", None, id="long-poll"),
    pytest.param("GET", f"/v1/requests/{RID}/images/0", None, id="image"),
    pytest.param("POST", f"/v1/requests/{RID}/abort", None, id="abort"),
    pytest.param("DELETE", f"/v1/requests/{RID}", None, id="delete"),
]


def _settings(tmp_path: Path, redis_url: str) -> Settings:
    return unit_settings(
        tmp_path, redis_url=redis_url, redis_socket_timeout_s=SOCKET_TIMEOUT_S, scheduler_block_ms=1
    )


@contextlib.asynccontextmanager
async def _served(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app with the clients its lifespan builds from ``settings.redis_url``."""
    app = create_app(settings)
    started = time.monotonic()
    async with app.router.lifespan_context(app):
        assert time.monotonic() - started < SOCKET_TIMEOUT_S + SLACK_S  # start-up does not wait for Redis
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api", timeout=30) as http:
            yield http


async def _call(http: httpx.AsyncClient, method: str, path: str, body: Any) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await http.request(method, path, json=body)
    return response, time.monotonic() - started


def _assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) > 0
    assert "unavailable" in response.json()["detail"]


# --- a closed port: connection refused ----------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def refused(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with _served(_settings(tmp_path, f"redis://127.0.0.1:{_closed_port()}/0")) as http:
        yield http


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
async def test_refused_is_503_at_once(refused: httpx.AsyncClient, method: str, path: str, body: Any) -> None:
    response, elapsed = await _call(refused, method, path, body)
    _assert_unavailable(response)
    assert elapsed < SOCKET_TIMEOUT_S + SLACK_S


async def test_healthz_refused_is_503_unavailable(refused: httpx.AsyncClient) -> None:
    response = await refused.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable"}
    assert int(response.headers["Retry-After"]) > 0


# --- a listener that never accepts: connect hangs (a host that drops packets) --------------------------------


@pytest.fixture
def full_backlog() -> Iterator[int]:
    """A port whose accept queue is full: further connects hang in SYN retries."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    fillers: list[socket.socket] = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_hanging_connect_is_503_within_socket_timeout(tmp_path: Path, full_backlog: int) -> None:
    async with _served(_settings(tmp_path, f"redis://127.0.0.1:{full_backlog}/0")) as http:
        for method, path, body in [("POST", "/v1/requests", {"prompt": "a cat"}), ("GET", f"/v1/requests/{RID}", None)]:
            response, elapsed = await _call(http, method, path, body)
            _assert_unavailable(response)
            assert elapsed < SOCKET_TIMEOUT_S + SLACK_S  # not the 5 s connect timeout
        response, elapsed = await _call(http, "GET", "/healthz", None)
        assert (response.status_code, response.json()) == (503, {"status": "unavailable"})
        assert elapsed < SOCKET_TIMEOUT_S + SLACK_S


# --- a RESP server answering what the test says ------------------------------------------------------------

Reply = Callable[[list[bytes]], bytes | None]
OK = b"+OK\r\n"
HELLO_3 = b"%1\r\n+proto\r\n:3\r\n"  # what a server answers to HELLO 3 (its other fields left out)
PONG = b"+PONG\r\n"
LOADING = b"-LOADING Redis is loading the dataset in memory\r\n"


def _map(fields: dict[str, str]) -> bytes:
    """A RESP3 map (redis-py 8 speaks RESP3 after ``HELLO 3``, which the stub answers with ``+OK``)."""
    out = [b"%%%d\r\n" % len(fields)]
    for item in (text for pair in fields.items() for text in pair):
        data = item.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class RespStub:
    """A TCP server speaking just enough RESP2 for redis-py: each command gets ``reply(command)``, or no answer
    at all when that is None (a stalled Redis)."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.commands: list[list[bytes]] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> RespStub:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while (command := await _read_command(reader)) is not None:
                self.commands.append(command)
                answer = self.reply(command)
                if answer == OK and _name(command) == "HELLO":
                    answer = HELLO_3  # redis-py 8.2 reads the handshake's map
                if answer is not None:
                    writer.write(answer)
                    await writer.drain()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


async def _read_command(reader: asyncio.StreamReader) -> list[bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    if not line.startswith(b"*"):
        return line.split()
    args = []
    for _ in range(int(line[1:])):
        length = int((await reader.readline())[1:])
        args.append((await reader.readexactly(length + 2))[:-2])
    return args


def _name(command: list[bytes]) -> str:
    return command[0].decode().upper() if command else ""


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
async def test_stalled_redis_is_503_within_socket_timeout(tmp_path: Path, method: str, path: str, body: Any) -> None:
    async with RespStub(lambda command: None) as stub, _served(_settings(tmp_path, stub.url)) as http:
        response, elapsed = await _call(http, method, path, body)
        _assert_unavailable(response)
        assert elapsed < SOCKET_TIMEOUT_S + SLACK_S


async def test_healthz_stalled_is_503_within_socket_timeout(tmp_path: Path) -> None:
    async with RespStub(lambda command: None) as stub, _served(_settings(tmp_path, stub.url)) as http:
        response, elapsed = await _call(http, "GET", "/healthz", None)
        assert (response.status_code, response.json()) == (503, {"status": "unavailable"})
        assert "Retry-After" in response.headers
        assert elapsed < SOCKET_TIMEOUT_S + SLACK_S


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
async def test_loading_redis_is_503(tmp_path: Path, method: str, path: str, body: Any) -> None:
    """A restarted Redis replays its AOF: every command gets ``-LOADING`` (``BusyLoadingError``)."""
    async with RespStub(lambda command: LOADING) as stub, _served(_settings(tmp_path, stub.url)) as http:
        response, _ = await _call(http, method, path, body)
        _assert_unavailable(response)
        health = await http.get("/healthz")
        assert (health.status_code, health.json()) == (503, {"status": "unavailable"})


def _array(values: list[str | None]) -> bytes:
    """A RESP3 array of bulk strings (None = RESP3 null), as HMGET answers."""
    out = [b"*%d\r\n" % len(values)]
    for value in values:
        out.append(b"_\r\n" if value is None else b"$%d\r\n%s\r\n" % (len(value.encode()), value.encode()))
    return b"".join(out)


def _queued_request(command: list[bytes]) -> bytes | None:
    if _name(command) == "HMGET":
        state = {"spec": SPEC.model_dump_json(), "status": "queued", "created_at": "1.0"}
        return _array([state.get(field.decode()) for field in command[2:]])
    if _name(command) == "SUBSCRIBE":
        return b"-ERR pub/sub is broken here\r\n"  # the completion waiter never gets a subscription
    return PONG if _name(command) == "PING" else OK


async def test_long_poll_without_completion_channel_ends_after_wait_s(tmp_path: Path) -> None:
    async with RespStub(_queued_request) as stub, _served(_settings(tmp_path, stub.url)) as http:
        response, elapsed = await _call(http, "GET", f"/v1/requests/{RID}?wait_s=0.6", None)
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "queued"
        assert 0.6 <= elapsed < 0.6 + SOCKET_TIMEOUT_S + SLACK_S


async def test_long_poll_ends_within_wait_s_plus_socket_timeout_when_redis_stalls_mid_wait(tmp_path: Path) -> None:
    reads = 0

    def stall_after_first_read(command: list[bytes]) -> bytes | None:
        nonlocal reads
        if _name(command) == "SUBSCRIBE":
            return None  # the waiter hangs on a dead channel
        if _name(command) == "HMGET":
            reads += 1
            return _queued_request(command) if reads == 1 else None
        return PONG if _name(command) == "PING" else OK

    async with RespStub(stall_after_first_read) as stub, _served(_settings(tmp_path, stub.url)) as http:
        response, elapsed = await _call(http, "GET", f"/v1/requests/{RID}?wait_s=0.6", None)
        _assert_unavailable(response)
        assert reads == 2
        assert 0.6 <= elapsed < 0.6 + SOCKET_TIMEOUT_S + SLACK_S


# --- whatever a Redis call raises ------------------------------------------------------------------------------


class FailingRedis(fakeredis.FakeAsyncRedis):
    """A client whose every command, alone or in a pipeline, raises ``failure`` (its pub/sub, which the waiter
    uses, still works)."""

    failure: BaseException = redis_errors.ConnectionError("down")

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        raise self.failure

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        failure = self.failure

        async def execute(raise_on_error: bool = True) -> Any:
            raise failure

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe


FAILURES = [
    redis_errors.ConnectionError("Connection refused"),
    redis_errors.TimeoutError("Timeout reading from socket"),
    redis_errors.BusyLoadingError("Redis is loading the dataset in memory"),
    ConnectionRefusedError(111, "Connection refused"),
    ConnectionResetError(104, "Connection reset by peer"),
    OSError(113, "No route to host"),
    TimeoutError(),  # = asyncio.TimeoutError since Python 3.11
]


def _failure_id(failure: BaseException) -> str:
    return f"{type(failure).__module__}.{type(failure).__name__}"


@pytest.mark.parametrize("failure", FAILURES, ids=_failure_id)
@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
async def test_every_redis_failure_is_503(
    tmp_path: Path, failure: BaseException, method: str, path: str, body: Any
) -> None:
    server = fakeredis.FakeServer()
    text = FailingRedis(server=server, decode_responses=True)
    text.failure = failure
    settings = unit_settings(tmp_path)
    app = create_app(settings, redis=text, results=fake_results(server, settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            response, _ = await _call(http, method, path, body)
            _assert_unavailable(response)
            health = await http.get("/healthz")
            assert (health.status_code, health.json()) == (503, {"status": "unavailable"})


async def test_recovers_once_redis_is_back(tmp_path: Path) -> None:
    async for api in api_harness(unit_settings(tmp_path)):
        await _recover(api)


async def _recover(api: Api) -> None:
    api.server.connected = False
    _assert_unavailable(await api.http.post("/v1/requests", json={"prompt": "a cat"}))
    api.server.connected = True
    response = await api.http.post("/v1/requests", json={"prompt": "a cat"})
    assert response.status_code == 202
    assert (await api.http.get("/healthz")).json() == {"status": "ok"}


class BrokenResultStore:
    """A result store whose every call fails, as an unreachable S3 does."""

    kind = "s3"

    def _fail(self, *_: object) -> None:
        raise ResultStoreError("Could not connect to the endpoint URL")

    put = get = delete = url = _fail


async def test_a_failing_result_store_is_503_naming_it(tmp_path: Path) -> None:
    settings = unit_settings(tmp_path)
    server = fakeredis.FakeServer()
    redis = fakeredis.FakeAsyncRedis(server=server, decode_responses=True)
    app = create_app(settings, redis=redis, results=BrokenResultStore())  # type: ignore[arg-type]
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            request_id = (await http.post("/v1/requests", json={"prompt": "a cat"})).json()["id"]
            await redis.hset(
                RedisKeys(settings.key_prefix).request(request_id),
                mapping={"status": "succeeded", "results": f"{request_id}/c1/0.png", "images": 1},
            )
            response = await http.get(f"/v1/requests/{request_id}/images/0")
            _assert_unavailable(response)
            assert "the result store (s3) is unavailable: ResultStoreError" in response.json()["detail"]
            # deleting still removes the state: the images are due in the journal, the sweeper retries them
            assert (await http.delete(f"/v1/requests/{request_id}")).status_code == 204
            assert (await http.get(f"/v1/requests/{request_id}")).status_code == 404
