"""Whether the webhooks of submitted requests may be called: this server's ``webhook_allowed_hosts`` (422 otherwise).

The rules are ``shared.webhook_hosts``'s; here the api resolves the host names (off the event loop, all at once,
each distinct host once per submission, each bounded by ``webhook_timeout_s``) and reports each refusal in
FastAPI's 422 ``detail`` format at the request's ``webhook`` field. The dispatcher checks again at each delivery:
an address that changed since is refused then.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

from api.limits import ErrorDict, Loc
from shared.settings import Settings
from shared.webhook_hosts import HostRules, WebhookRefused, WebhookUrl, parse_url
from shared.wire import GenerateRequest


async def resolve(host: str, port: int, timeout_s: float) -> list[str]:
    """The addresses of ``host`` (``WebhookRefused`` when it cannot be resolved within ``timeout_s``)."""
    try:
        async with asyncio.timeout(timeout_s):
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except TimeoutError:
        raise WebhookRefused(f"host {host} could not be resolved within {timeout_s:g} s") from None
    except OSError as exc:
        raise WebhookRefused(f"host {host} could not be resolved ({exc.strerror or exc})") from None
    return [str(info[4][0]) for info in infos]


async def _refusal(rules: HostRules, url: WebhookUrl, timeout_s: float) -> WebhookRefused | None:
    """Why ``url`` may not be called, or None when it may."""
    try:
        if rules.check_host(url) is None:  # a name: checked where it resolves to
            rules.check_addresses(url, await resolve(url.host, url.port, timeout_s))
    except WebhookRefused as exc:
        return exc
    return None


async def webhook_errors(
    requests: Sequence[GenerateRequest], settings: Settings, locs: Sequence[Loc]
) -> list[ErrorDict]:
    """A 422 error at ``webhook`` for each request whose webhook this server refuses; empty when all may be called."""
    wanted = [(request.webhook, loc) for request, loc in zip(requests, locs, strict=True) if request.webhook]
    if not wanted:
        return []
    rules = settings.webhook_rules
    checks: dict[str, asyncio.Task[WebhookRefused | None]] = {}
    async with asyncio.TaskGroup() as group:
        for webhook, _ in wanted:
            url = parse_url(webhook)  # its form was validated with the request
            if url.host not in checks:
                checks[url.host] = group.create_task(_refusal(rules, url, settings.webhook_timeout_s))
    errors: list[ErrorDict] = []
    for webhook, loc in wanted:
        refusal = checks[parse_url(webhook).host].result()
        if refusal is not None:
            errors.append({"type": "webhook_refused", "loc": (*loc, "webhook"), "msg": str(refusal), "input": webhook})
    return errors
