"""Webhooks (``docs/operations.md#webhooks``): which hosts a request's webhook may name, how deliveries are signed,
timed, retried and run."""

from __future__ import annotations

import json
from typing import Annotated, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from shared.settings.concern import EmptyIsUnset, SettingsConcern
from shared.webhook_hosts import HostRules


class WebhookSettings(SettingsConcern):
    """The allowed hosts and the secret of webhook deliveries, their timeout, attempts, backoff and concurrency."""

    section = "Webhooks"

    webhook_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Hosts a request's webhook URL may name, comma separated (or a JSON list): host names (hooks.example.com),
    sub-domains (*.example.com), * (any host), IP addresses or networks (10.0.0.0/8). Every address a host is or
    resolves to must be public unless a listed network contains it (internal addresses only when listed). Empty:
    webhooks are off (a request with one gets 422). Needs webhook_secret."""

    webhook_secret: Annotated[SecretStr | None, EmptyIsUnset] = None
    """Key of the HMAC-SHA256 signature of every webhook delivery (header Fusefleet-Signature: t=<unix s>,v1=<hex of
    HMAC(secret, '<t>.<body>')>); the receivers verify with it. Required with webhook_allowed_hosts."""

    webhook_timeout_s: float = Field(10.0, gt=0, le=120)
    """Connecting to a webhook receiver, sending the delivery and waiting for its answer each take at most this long
    (then the attempt failed); also bounds the api's resolution of a webhook host."""

    webhook_max_attempts: int = Field(8, ge=1, le=30)
    """Attempts of one webhook delivery (any answer but 2xx, a timeout or a refused connection is a failed attempt)
    before it is dropped and recorded on the request (webhook_error)."""

    webhook_retry_initial_s: float = Field(2.0, gt=0, le=600)
    """Wait after a delivery's first failed attempt; it doubles after each further one (at most 600 s): with 8 attempts,
    2+4+...+128 = 254 s of waits before a delivery is dropped."""

    webhook_concurrency: int = Field(16, ge=1, le=256)
    """Webhook deliveries in flight at once (threads of the active dispatcher); one request's events always go one at a
    time, in order."""

    @field_validator("webhook_allowed_hosts", mode="before")
    @classmethod
    def _host_list(cls, value: object) -> object:
        """A comma-separated string (or a JSON list) from the environment; each entry must parse (``HostRules``)."""
        if isinstance(value, str):
            value = json.loads(value) if value.strip().startswith("[") else value.split(",")
        if isinstance(value, list):
            value = [str(entry).strip() for entry in value if str(entry).strip()]
            HostRules.parse(value)
        return value

    @model_validator(mode="after")
    def _deliveries_are_signed(self) -> Self:
        if self.webhook_allowed_hosts and self.webhook_secret is None:
            raise ValueError(
                "webhook_allowed_hosts needs webhook_secret (FUSEFLEET_WEBHOOK_SECRET): every delivery is signed"
            )
        return self

    @property
    def webhook_rules(self) -> HostRules:
        """``webhook_allowed_hosts``, parsed (``shared.webhook_hosts``)."""
        return HostRules.parse(self.webhook_allowed_hosts)
