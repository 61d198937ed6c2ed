"""Redis memory per queued image-conditioned request: what one input image costs while its request waits.

``python -m bench.input_memory [--requests 20]``: for each case, a fresh private Redis and the api in this process
(no scheduler, no worker: every request stays queued); ``requests`` requests with the same JPEG input are submitted,
and the figures are ``MEMORY USAGE`` of one request hash and the ``used_memory`` delta per request (what the queue
really costs: hash, stream entry, event stream, allocator rounding). The JPEG is the sample photo shipped with
matplotlib, resized to the case's side (quality 85). Cases: a 2048² input for a 2048² request, a 512² input for a
512² request, and a 2048² input for a 512² request (resized by the api).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import tempfile
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
from PIL import Image

from api.app import create_app
from fusefleet.valkey import EmbeddedValkey
from shared.keys import RedisKeys
from shared.settings import Settings

CASES = ((2048, 2048), (512, 512), (2048, 512))  # (input side, request side)


def photo_jpeg(side: int) -> bytes:
    """A photo (matplotlib's sample) as a ``side`` x ``side`` JPEG, quality 85."""
    import matplotlib

    photo = Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg").convert("RGB")
    buffer = io.BytesIO()
    photo.resize((side, side), Image.Resampling.LANCZOS).save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


async def measure(redis_url: str, requests: int, source: int, side: int) -> dict[str, Any]:
    """The figures of one case, on a Redis of its own (a fresh server: no buffers or freed memory of another)."""
    settings = Settings(redis_url=redis_url, key_prefix="mem", max_queue_len=10_000, model=None)
    keys = RedisKeys(settings.key_prefix)
    redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
    app = create_app(settings, redis=redis)
    jpeg = photo_jpeg(source)
    body = {"prompt": "a portrait", "width": side, "height": side, "image": base64.b64encode(jpeg).decode()}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api", timeout=60) as http:
            before = int((await redis.info("memory"))["used_memory"])
            ids = []
            for _ in range(requests):
                answer = await http.post("/v1/requests", json=body)
                assert answer.status_code == 202, answer.text
                ids.append(answer.json()["id"])
            after = int((await redis.info("memory"))["used_memory"])
            row = {
                "input": f"{source}x{source} JPEG",
                "request": f"{side}x{side}",
                "jpeg_bytes": len(jpeg),
                "stored_bytes": await redis.hstrlen(keys.request(ids[0]), "input_image"),
                "memory_usage_hash": await redis.memory_usage(keys.request(ids[0])),
                "used_memory_per_request": (after - before) // requests,
            }
    await redis.aclose()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=20, help="queued requests per case")
    args = parser.parse_args()
    for source, side in CASES:
        with tempfile.TemporaryDirectory() as folder:
            server = EmbeddedValkey(Path(folder)).start()
            try:
                print(json.dumps(asyncio.run(measure(server.url, args.requests, source, side))))
            finally:
                server.stop()


if __name__ == "__main__":
    main()
