"""LitServe 0.2 peer: the demo diffusers pipeline behind LitServe's dynamic batching (run in .bench-venvs/litserve).

    BENCH_MODEL_DIR=/tmp/peer-model/demo-sd-v1 .bench-venvs/litserve/bin/python bench/peers/litserve_server.py \
        --port 8000

POST /predict with one JSON request object and get the PNG bytes back (``Content-Type: image/png``):

    {"prompt": "a cat", "width": 64, "height": 64, "num_inference_steps": 4, "guidance_scale": 7.5, "seed": 1}

Knobs:
    BENCH_MAX_BATCH_SIZE      LitAPI max_batch_size (default 4)
    BENCH_BATCH_TIMEOUT_S     LitAPI batch_timeout (default 0.02): a wait window. The inference worker, once
                              idle, collects up to max_batch_size requests for at most batch_timeout seconds
                              from the moment it starts collecting, then runs whatever it has (at least one).
    BENCH_REQUEST_TIMEOUT_S   LitServer timeout (default 600); a request queued longer gets HTTP 504
    BENCH_RUNNER, BENCH_TORCH_THREADS, BENCH_MODEL_DIR: see peer_common.

In litserve 0.2.19 ``max_batch_size``/``batch_timeout`` belong to ``LitAPI`` (the ``LitServer`` arguments of the
same name are deprecated and only copied onto the API).
"""

import argparse
from typing import Any

import litserve as ls
from fastapi import Response
from peer_common import env_float, env_int, load_forward, log, normalize_request, run_batch


class PeerDiffusionAPI(ls.LitAPI):
    def setup(self, device: str) -> None:
        self.forward = load_forward()
        log(f"litserve setup on {device}: max_batch_size={self.max_batch_size} batch_timeout={self.batch_timeout}")

    # No annotation on ``request`` and no ``from __future__ import annotations``: LitServe builds the FastAPI
    # endpoint from these annotations, and an unannotated request means "JSON body, parsed to a dict".
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        return normalize_request(request)

    def batch(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(inputs)

    def predict(self, x: Any) -> Any:
        if isinstance(x, dict):  # max_batch_size == 1: LitServe skips batch()/unbatch()
            return run_batch(self.forward, [x], "litserve")[0]
        return run_batch(self.forward, x, "litserve")

    def unbatch(self, output: list[bytes]) -> list[bytes]:
        return list(output)

    def encode_response(self, output: bytes) -> Response:
        return Response(content=output, media_type="image/png")


def build_server() -> ls.LitServer:
    api = PeerDiffusionAPI(
        max_batch_size=env_int("BENCH_MAX_BATCH_SIZE", 4),
        batch_timeout=env_float("BENCH_BATCH_TIMEOUT_S", 0.02),
    )
    return ls.LitServer(
        api,
        accelerator="cpu",
        devices=1,
        workers_per_device=1,
        timeout=env_float("BENCH_REQUEST_TIMEOUT_S", 600.0),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    build_server().run(host=args.host, port=args.port, num_api_servers=1, generate_client_file=False)


if __name__ == "__main__":
    main()
