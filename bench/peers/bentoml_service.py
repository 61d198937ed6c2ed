"""BentoML 1.4 peer: the demo diffusers pipeline behind one adaptive-batching API (run in .bench-venvs/bentoml).

    BENCH_MODEL_DIR=/tmp/peer-model/demo-sd-v1 .bench-venvs/bentoml/bin/python -m bentoml serve \
        bentoml_service:PeerDiffusion --working-dir bench/peers --port 3000

POST /generate with a JSON *list* of request objects (BentoML's batch dimension is the list; one request per
HTTP call is the comparable load) and get a JSON list of base64 PNGs back, one per object:

    [{"prompt": "a cat", "width": 64, "height": 64, "num_inference_steps": 4, "guidance_scale": 7.5, "seed": 1}]
    -> ["iVBORw0KGgo..."]

Knobs (read at import, so set them in the environment of ``bentoml serve``):
    BENCH_MAX_BATCH_SIZE      max_batch_size (default 4). BentoML requires > 1 for a batchable API, so 1 means
                              a plain (non-batchable) API behind a lock: one request per pipeline call.
    BENCH_MAX_LATENCY_MS      max_latency_ms (default 20000). NOT a wait window: it is a latency SLO. BentoML's
                              CorkDispatcher fits batch time = a * n + b from past batches and waits for more
                              requests only while that helps; it has no separate wait knob (the wait is learned).
                              A queued request whose predicted latency (queue wait + a * n + b) reaches the SLO
                              is dropped with HTTP 503 ("process is overloaded"), so under overload BentoML
                              sheds load where the others queue.
    BENCH_REQUEST_TIMEOUT_S   traffic timeout (default 600)
    BENCH_RUNNER, BENCH_TORCH_THREADS, BENCH_MODEL_DIR: see peer_common.
"""

from __future__ import annotations

import base64
import threading

import bentoml
from peer_common import env_float, env_int, load_forward, normalize_request, run_batch
from pydantic import BaseModel

MAX_BATCH_SIZE = env_int("BENCH_MAX_BATCH_SIZE", 4)
MAX_LATENCY_MS = env_int("BENCH_MAX_LATENCY_MS", 20000)
REQUEST_TIMEOUT_S = env_float("BENCH_REQUEST_TIMEOUT_S", 600.0)


class GenerateRequest(BaseModel):
    prompt: str
    width: int = 64
    height: int = 64
    num_inference_steps: int = 4
    guidance_scale: float = 7.5
    seed: int = 0


if MAX_BATCH_SIZE > 1:
    _api = bentoml.api(route="/generate", batchable=True, max_batch_size=MAX_BATCH_SIZE, max_latency_ms=MAX_LATENCY_MS)
else:
    _api = bentoml.api(route="/generate")


@bentoml.service(workers=1, traffic={"timeout": REQUEST_TIMEOUT_S})
class PeerDiffusion:
    def __init__(self) -> None:
        self.forward = load_forward()
        self.lock = threading.Lock()  # one pipeline call at a time, also when the API is not batchable

    @_api
    def generate(self, requests: list[GenerateRequest], /) -> list[str]:
        reqs = [normalize_request(r.model_dump()) for r in requests]
        with self.lock:
            pngs = run_batch(self.forward, reqs, "bentoml")
        return [base64.b64encode(png).decode("ascii") for png in pngs]
