"""An HTTP load generator: arrival patterns x workload mixes against a target (fusefleet or a peer server).

Arrival patterns:
- ``poisson``: open loop, exponential inter-arrival times at ``rate`` requests/s (arrivals never wait for answers);
- ``closed``: ``concurrency`` clients, each sending its next request when the previous one is answered;
- ``burst``: ``burst_size`` requests at once, every ``burst_gap_s`` seconds.

Workloads: ``homog`` (every request 64 px) and ``mixed`` (64 px and 32 px interleaved 50/50); ``sides`` replaces
those sizes (the GPU-shaped benchmark: 512 px, and 512/768 px interleaved); ``steps_choices`` and
``guidance_choices`` likewise cycle step counts and guidance scales request by request (the step-mode benchmark),
and ``strength_choices`` tasks: a strength makes the request image-to-image (a grey input image of its size, sent
as a ``data:`` URL), ``None`` text-to-image.
Each request is recorded (submit, server timestamps when the target reports them, finish, batch size, status).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from PIL import Image

from bench.targets import RequestRecord, Target

Pattern = Literal["poisson", "closed", "burst"]
Workload = Literal["homog", "mixed"]
SIZES: dict[str, tuple[int, ...]] = {"homog": (64,), "mixed": (64, 32)}


@dataclass(frozen=True)
class LoadSpec:
    """One load run: how requests arrive and what they ask for."""

    pattern: Pattern = "closed"
    workload: Workload = "homog"
    count: int = 100
    rate: float = 10.0  # poisson: offered requests/s
    concurrency: int = 8  # closed
    burst_size: int = 16  # burst
    burst_gap_s: float = 1.0  # burst
    steps: int = 4
    guidance_scale: float = 5.0
    seed: int = 0
    sides: tuple[int, ...] = ()  # image sides cycled request by request; () = the workload's SIZES
    steps_choices: tuple[int, ...] = ()  # step counts cycled request by request; () = steps
    guidance_choices: tuple[float, ...] = ()  # guidance scales cycled request by request; () = guidance_scale
    strength_choices: tuple[float | None, ...] = ()  # image-to-image strengths cycled (None: text-to-image)

    def params(self, index: int) -> dict[str, Any]:
        sizes = self.sides or SIZES[self.workload]
        side = sizes[index % len(sizes)]
        steps = self.steps_choices or (self.steps,)
        guidance = self.guidance_choices or (self.guidance_scale,)
        params: dict[str, Any] = {
            "prompt": f"benchmark prompt {index}",
            "width": side,
            "height": side,
            "num_inference_steps": steps[index % len(steps)],
            "guidance_scale": guidance[index % len(guidance)],
            "seed": 1000 + index,
        }
        strength = self.strength_choices[index % len(self.strength_choices)] if self.strength_choices else None
        if strength is not None:
            params |= {"image": input_image(side), "strength": strength}
        return params


@functools.cache
def input_image(side: int) -> str:
    """A grey ``side`` x ``side`` PNG as a ``data:`` URL (an image-to-image request's input)."""
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (128, 128, 128)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


async def run_load(target: Target, spec: LoadSpec, timeout_s: float = 600.0) -> list[RequestRecord]:
    """Send ``spec.count`` requests to ``target`` following ``spec.pattern``; returns one record per request."""
    connector = aiohttp.TCPConnector(limit=0)  # no client-side cap: the load pattern alone sets concurrency
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        one: Callable[[int], Awaitable[RequestRecord]] = lambda i: target.send(session, spec.params(i))  # noqa: E731
        if spec.pattern == "closed":
            return await _closed(one, spec)
        if spec.pattern == "poisson":
            return await _open(one, spec, _poisson_offsets(spec))
        return await _open(one, spec, _burst_offsets(spec))


async def _closed(one: Callable[[int], Awaitable[RequestRecord]], spec: LoadSpec) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    counter = iter(range(spec.count))

    async def client_loop() -> None:
        for index in counter:
            records.append(await one(index))

    await asyncio.gather(*(client_loop() for _ in range(spec.concurrency)))
    return records


def _poisson_offsets(spec: LoadSpec) -> list[float]:
    rng = random.Random(spec.seed)
    offsets, t = [], 0.0
    for _ in range(spec.count):
        offsets.append(t)
        t += rng.expovariate(spec.rate)
    return offsets


def _burst_offsets(spec: LoadSpec) -> list[float]:
    return [(i // spec.burst_size) * spec.burst_gap_s for i in range(spec.count)]


async def _open(
    one: Callable[[int], Awaitable[RequestRecord]], spec: LoadSpec, offsets: list[float]
) -> list[RequestRecord]:
    start = time.monotonic()

    async def at(index: int, offset: float) -> RequestRecord:
        await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
        return await one(index)

    return list(await asyncio.gather(*(at(i, off) for i, off in enumerate(offsets))))
