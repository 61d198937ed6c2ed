"""Text-to-video on the real tiny LTX-Video demo pipeline (``FUSEFLEET_DEMO_FAMILY=ltx-video``), through a fleet:
compatible video requests share one forward, a different frame count never does, every video is an MP4 that
decodes to the requested frames and size (its frames also served as PNGs), a fused video equals its solo run within
1/255, and the api refuses what the model cannot do (frame rule, size multiple) from what the worker announced."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from demo_models import ensure_demo_model
from fusefleet.client import Client
from tests.integration.conftest import running_fleet
from tests.support.redis_server import RedisServer
from tests.support.video import FRAMES, SIDE, mp4_frames, video_body

pytestmark = pytest.mark.timeout(600)


def test_video_requests_are_fused_stored_and_served(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path: Path
) -> None:
    ensure_demo_model(model_cache, "ltx-video")  # built once here, not under the worker's start timeout
    with running_fleet(
        redis_server,
        model_cache,
        lora_dir,
        tmp_path,
        FUSEFLEET_RUNNER="gpu_worker.diffusers_runner:DiffusersRunner",
        FUSEFLEET_DEMO_FAMILY="ltx-video",
        FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS="1000",
    ) as fleet:
        # refused up front, from what the worker announced: 8k + 1 frames, sides multiple of 32
        refused = fleet.http.post("/v1/requests", json={**video_body("bad", 1, frames=10), "width": 48})
        assert refused.status_code == 422, refused.text
        assert {error["loc"][-1] for error in refused.json()["detail"]} == {"num_frames", "width"}

        ids = fleet.submit_batch([video_body("a fox", 1), video_body("a whale", 2), video_body("a fox", 1, frames=17)])
        states = fleet.wait_done(ids, timeout=300)
        assert [states[rid]["status"] for rid in ids] == ["succeeded"] * 3, states
        assert states[ids[0]]["batch_id"] == states[ids[1]]["batch_id"] and states[ids[0]]["batch_size"] == 2
        assert states[ids[2]]["batch_id"] != states[ids[0]]["batch_id"]  # 17 frames: another key

        for rid, frames in zip(ids, (FRAMES, FRAMES, 17), strict=True):
            state = states[rid]
            assert state["videos"] == [f"/v1/requests/{rid}/videos/0"] and len(state["images"]) == frames
            video = fleet.http.get(f"/v1/requests/{rid}/video")
            assert video.status_code == 200 and video.headers["content-type"] == "video/mp4"
            decoded = mp4_frames(video.content)
            assert decoded.shape == (frames, SIDE, SIDE, 3)
            first_png = Image.open(io.BytesIO(fleet.image(rid, 0)))
            assert first_png.size == (SIDE, SIDE)
            with Client(fleet.base_url) as client:
                assert client.video(rid) == video.content

        # the fused video equals a solo run of the same request (PNG frames: lossless, within 1/255)
        (solo,) = fleet.submit_batch([video_body("a fox", 1)])
        assert fleet.wait_done([solo], timeout=300)[solo]["batch_size"] == 1
        for index in range(FRAMES):
            fused = np.asarray(Image.open(io.BytesIO(fleet.image(ids[0], index))), dtype=np.int16)
            alone = np.asarray(Image.open(io.BytesIO(fleet.image(solo, index))), dtype=np.int16)
            assert np.abs(fused - alone).max() <= 1, f"frame {index} differs fused vs solo"
