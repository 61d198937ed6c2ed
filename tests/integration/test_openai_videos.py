"""The OpenAI Videos API of a real fleet serving the tiny LTX-Video, Wan text-to-video and Wan image-to-video demo
models (``FUSEFLEET_MODELS``, one worker each, the real diffusers runner), called with the official ``openai``
client: ``create_and_poll`` completes and ``download_content`` is an MP4 that decodes to the asked frames and size
(LTX and Wan), two compatible jobs share one forward, ``list`` pages, ``delete`` of a running job ends it aborted
natively and the client sees the failure, and a bad ``size`` or ``seconds`` is a 400 naming ``param``.

Image-to-video: ``input_reference`` uploads are each job's first frame; two Wan image-to-video jobs are fused into
one forward, each equal to its solo run within 1/255; a text-only job to that model is a 400 naming
``input_reference``; LTX-Video's image-to-video runs from the same call, and natively refuses what it does not take
(``strength``, a mask) naming the field.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image

from demo_models import ensure_demo_model
from gpu_worker.video import decode_mp4
from tests.integration.conftest import Fleet, running_fleet
from tests.support.processes import wait_for
from tests.support.redis_server import RedisServer
from tests.support.solo import png_array
from tests.support.video import SIDE, picture, png_bytes, video_body

pytestmark = [pytest.mark.timeout(600), pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]

SIZE, SECONDS, FPS, FRAMES = "32x32", "1", 8, 9  # 1 s at 8 fps: 9 frames, LTX's 8k + 1
EXTRA = {"fps": FPS, "num_inference_steps": 2, "guidance_scale": 3.0}


MODELS = {"ltx": "ltx-video", "wan": "wan", "wan-i2v": "wan-i2v"}
"""The fleet's models (the first, LTX-Video, its default) -> their demo family; one worker each."""


@pytest.fixture(scope="module")
def fleet(
    redis_server: RedisServer, model_cache: Path, lora_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    for family in MODELS.values():
        ensure_demo_model(model_cache, family)  # built once here, not under the workers' start timeout
    with running_fleet(
        redis_server,
        model_cache,
        lora_dir,
        tmp_path_factory.mktemp("openai-videos-logs"),
        workers=0,
        FUSEFLEET_RUNNER="gpu_worker.diffusers_runner:DiffusersRunner",
        FUSEFLEET_MODELS=",".join(f"{name}=demo:{family}" for name, family in MODELS.items()),
        FUSEFLEET_REQUEST_BATCH_MAX_WAIT_MS="1000",
    ) as one:
        started = [one.new_worker(f"{model}-worker", FUSEFLEET_WORKER_MODELS=model).start() for model in MODELS]
        one.workers += started  # started together: their imports and loads overlap
        nodes = [worker.env["FUSEFLEET_WORKER_NAME"] for worker in started]
        wait_for(lambda: one.redis.zcard(one.keys.workers) >= len(nodes), 180, f"workers {nodes} to beat")
        yield one


@pytest.fixture(scope="module")
def client(fleet: Fleet) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fleet.base_url + "/v1", api_key="unused", max_retries=0, timeout=120) as one:
        yield one


def test_create_and_poll_then_download_an_mp4_of_the_asked_frames(fleet: Fleet, client: openai.OpenAI) -> None:
    video = client.videos.create_and_poll(
        prompt="a lighthouse at dusk",
        size=SIZE,
        seconds=SECONDS,
        poll_interval_ms=200,
        extra_body={**EXTRA, "seed": 1},  # type: ignore[arg-type]
    )
    assert (video.status, video.progress, video.size, video.seconds) == ("completed", 100, SIZE, "1.125"), video
    native = fleet.get(video.id)  # the job is a native request, same id
    assert native["status"] == "succeeded" and native["params"]["num_frames"] == FRAMES

    mp4 = client.videos.download_content(video.id).content
    frames = decode_mp4(mp4)
    assert len(frames) == FRAMES and {frame.size for frame in frames} == {(32, 32)}
    assert mp4 == fleet.http.get(f"/v1/requests/{video.id}/video").content
    with Image.open(io.BytesIO(client.videos.download_content(video.id, variant="thumbnail").content)) as still:
        assert (still.format, still.size) == ("PNG", (32, 32))
    events = fleet.http.get(f"/v1/requests/{video.id}/events", timeout=30)  # its live events, as any request's
    names = [line.removeprefix("event: ") for line in events.text.splitlines() if line.startswith("event: ")]
    assert names[0] == "queued" and "running" in names and names[-1] == "succeeded", names


def test_two_compatible_jobs_share_one_forward(fleet: Fleet, client: openai.OpenAI) -> None:
    def one(seed: int) -> openai.types.Video:
        return client.videos.create_and_poll(
            prompt=f"a fox, take {seed}",
            size=SIZE,
            seconds=SECONDS,
            poll_interval_ms=200,
            extra_body={**EXTRA, "seed": seed},  # type: ignore[arg-type]
        )

    with ThreadPoolExecutor(2) as pool:
        videos = list(pool.map(one, (11, 12)))
    assert [video.status for video in videos] == ["completed", "completed"]
    states = [fleet.get(video.id) for video in videos]
    assert states[0]["batch_id"] == states[1]["batch_id"] and states[0]["batch_size"] == 2, states
    assert decode_mp4(client.videos.download_content(videos[0].id).content) != []


def test_list_pages_newest_first(client: openai.OpenAI) -> None:
    ids = [client.videos.create(prompt=f"clip {i}", size=SIZE, seconds=SECONDS, extra_body=EXTRA).id for i in range(3)]  # type: ignore[arg-type]
    page = client.videos.list(limit=2)
    assert [video.id for video in page.data] == ids[:-3:-1] and page.has_more
    listed = [video.id for video in client.videos.list(limit=2)]  # the client follows the pages
    assert listed[:3] == ids[::-1] and len(listed) == len(set(listed))
    for video_id in ids:
        assert client.videos.poll(video_id, poll_interval_ms=200).status == "completed"


def test_delete_of_a_running_job_aborts_it(fleet: Fleet, client: openai.OpenAI) -> None:
    job = client.videos.create(
        prompt="a long clip", size=SIZE, seconds=SECONDS, extra_body={**EXTRA, "num_inference_steps": 400}
    )  # type: ignore[arg-type]
    wait_for(lambda: client.videos.retrieve(job.id).progress > 0, 120, f"video {job.id} to make progress")
    deleted = client.videos.delete(job.id)
    assert (deleted.id, deleted.deleted) == (job.id, False)  # aborted, kept until deleted again
    video = client.videos.poll(job.id, poll_interval_ms=200)
    assert video.status == "failed" and video.error is not None and video.error.code == "aborted", video
    native = fleet.get(job.id)
    assert native["status"] == "aborted" and native["progress"]["step"] < 400, native
    assert client.videos.delete(job.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(job.id)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"size": "48x32"}, "size"),
        ({"size": "720x1280"}, "size"),
        ({"seconds": "abc"}, "seconds"),
        ({"seconds": "600"}, "seconds"),
    ],
)
def test_a_bad_size_or_seconds_is_a_400_naming_param(client: openai.OpenAI, body: dict[str, str], param: str) -> None:
    fields = {"size": SIZE, "seconds": SECONDS, **body}
    with pytest.raises(openai.BadRequestError) as refused:
        client.videos.create(prompt="a fox", **fields, extra_body=EXTRA)  # type: ignore[arg-type]
    assert (refused.value.param, refused.value.code) == (param, "invalid_value"), refused.value.body


def test_wan_create_and_poll_then_download_an_mp4_of_the_asked_frames(client: openai.OpenAI) -> None:
    video = client.videos.create_and_poll(
        model="wan",  # type: ignore[arg-type]
        prompt="a heron",
        size="48x32",  # Wan: multiples of 16
        seconds="0.5",  # 4 at 8 fps: 5 frames, Wan's 4k + 1
        poll_interval_ms=200,
        extra_body={**EXTRA, "seed": 3},  # type: ignore[arg-type]
    )
    assert (video.status, video.model, video.size, video.seconds) == ("completed", "wan", "48x32", "0.625"), video
    frames = decode_mp4(client.videos.download_content(video.id).content)
    assert len(frames) == 5 and {frame.size for frame in frames} == {(48, 32)}


def reference(seed: int) -> tuple[str, bytes, str]:
    return (f"first-{seed}.png", png_bytes(picture(seed)), "image/png")


def test_image_to_video_jobs_are_fused_and_equal_their_solo_runs(fleet: Fleet, client: openai.OpenAI) -> None:
    def one(seed: int) -> openai.types.Video:
        return client.videos.create_and_poll(
            model="wan-i2v",  # type: ignore[arg-type]
            prompt=f"a fox, take {seed}",
            size=SIZE,
            seconds=SECONDS,
            input_reference=reference(seed),
            poll_interval_ms=200,
            extra_body={**EXTRA, "seed": seed},  # type: ignore[arg-type]
        )

    with ThreadPoolExecutor(2) as pool:
        fused = list(pool.map(one, (21, 22)))
    assert [video.status for video in fused] == ["completed", "completed"], fused
    states = [fleet.get(video.id) for video in fused]
    assert states[0]["batch_id"] == states[1]["batch_id"] and states[0]["batch_size"] == 2, states
    assert states[0]["params"].get("strength") is None  # image-to-video takes no strength: none is echoed
    for video, seed in zip(fused, (21, 22), strict=True):
        solo = one(seed)
        assert fleet.get(solo.id)["batch_size"] == 1
        for index in range(FRAMES):
            mine = png_array(fleet.image(video.id, index))
            alone = png_array(fleet.image(solo.id, index))
            assert np.abs(mine - alone).max() <= 1, f"{video.id}: frame {index} differs fused vs solo"


def test_an_image_to_video_model_needs_input_reference(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.videos.create(model="wan-i2v", prompt="a fox", size=SIZE, seconds=SECONDS, extra_body=EXTRA)  # type: ignore[arg-type]
    assert refused.value.param == "input_reference" and "image-to-image" in refused.value.message


def test_ltx_image_to_video_from_the_same_call_and_its_native_refusals(fleet: Fleet, client: openai.OpenAI) -> None:
    video = client.videos.create_and_poll(
        prompt="a lighthouse",
        size=SIZE,
        seconds=SECONDS,
        input_reference=reference(4),
        poll_interval_ms=200,
        extra_body={**EXTRA, "seed": 4},  # type: ignore[arg-type]
    )
    assert video.status == "completed", video
    assert len(decode_mp4(client.videos.download_content(video.id).content)) == FRAMES
    # refused up front from what the worker announced: LTX's image-to-video takes no strength and no mask
    refused = fleet.http.post("/v1/requests", json=video_body("bad", 1, picture(1), strength=0.5))
    assert refused.status_code == 422, refused.text
    assert [error["loc"][-1] for error in refused.json()["detail"]] == ["strength"]
    mask = base64.b64encode(png_bytes(Image.new("L", (SIDE, SIDE), 255))).decode()
    refused = fleet.http.post("/v1/requests", json=video_body("bad", 1, picture(1), mask_image=mask))
    assert refused.status_code == 422 and refused.json()["detail"][0]["type"] == "task_unsupported", refused.text
