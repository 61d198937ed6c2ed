"""A scripted HTTP server for client tests: an ``httpx.MockTransport`` that gives its answers in turn (the last one
again and again) and records every request it was sent."""

from __future__ import annotations

import httpx


def scripted(answers: list[httpx.Response]) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """A transport answering ``answers`` in order (taken from the list; the last one repeats) and the list of the
    requests it receives."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0) if len(answers) > 1 else answers[0]

    return httpx.MockTransport(answer), seen
