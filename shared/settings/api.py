"""The api process: where it listens, its API keys, its event streams."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from shared.settings.concern import EmptyIsUnset, OptionalUserPath, SettingsConcern


class ApiSettings(SettingsConcern):
    """``fusefleet api``'s address, its API keys file and the event streams one api process serves."""

    section = "API"

    api_host: str = "127.0.0.1"
    """Address `fusefleet api` binds when --host is not given."""

    api_port: int = Field(8000, ge=1, le=65535)
    """Port `fusefleet api` binds when --port is not given."""

    api_keys_file: Annotated[OptionalUserPath, EmptyIsUnset] = None
    """TOML file of the API keys (`fusefleet keys new NAME` mints one): each key's name, the sha256 of its token, and
    optional rate_per_s, burst and max_queued. Set: every endpoint but /healthz and /metrics needs `Authorization:
    Bearer <token>`, and a key sees only its own requests. Read at start (an invalid file stops the api) and again
    within 1 s of a change. Unset or empty: no authentication."""

    idempotency_ttl_s: int = Field(86_400, ge=1)
    """How long a submission's Idempotency-Key is remembered (at most result_ttl_s, the life of its requests): a
    submission sent again with the same key (and body) within it gets the first one's ids, queued once."""

    max_event_streams: int = Field(1000, ge=1)
    """Event streams (GET /v1/requests/{id}/events, GET /v1/events) one api process serves at once; each holds one Redis
    connection of its own while it waits. More are refused: 503 with Retry-After."""

    max_event_streams_per_key: int = Field(100, ge=1)
    """Event streams one API key (without API keys: one client address) has open at once on one api process, so that no
    caller takes all of max_event_streams. More are refused: 429 with Retry-After. Behind a reverse proxy the address is
    the proxy's unless uvicorn trusts its X-Forwarded-For (FORWARDED_ALLOW_IPS, 127.0.0.1 by default)."""

    max_event_ids: int = Field(100, ge=1, le=10_000)
    """Most request ids one GET /v1/events stream watches (?ids=); more are a 422."""

    event_ping_s: float = Field(15.0, gt=0, le=300)
    """Seconds between keep-alive comments on a quiet event stream, so proxies keep the connection open."""
