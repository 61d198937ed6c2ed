"""``fusefleet.client`` and ``fusefleet generate`` against a real fleet (api, scheduler and a worker process with
the tiny demo model; ``ExplodingRunner`` fails any forward whose prompt says "explode")."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from fusefleet.client import AsyncClient, Client, RequestStatus, encode_image
from shared.wire import GenerateRequest, RequestView
from tests.integration.conftest import Fleet
from tests.support.runners import EXPLODE_MARKER

ROOT = Path(__file__).resolve().parents[2]
TOO_MANY_STEPS = 6000  # the fleet's FUSEFLEET_MAX_INFERENCE_STEPS is 5000: refused by the api, not the client
needs_image_fields = pytest.mark.skipif(
    "image" not in GenerateRequest.model_fields, reason="GenerateRequest has no image fields yet"
)


def _size(png: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(png)) as image:
        assert image.format == "PNG"
        return image.size


def _cli(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FUSEFLEET_")}
    command = [sys.executable, "-m", "fusefleet", "generate", *args, "--url", fleet.base_url]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_generate_isolates_a_failing_and_a_refused_request(fleet: Fleet) -> None:
    requests: list[GenerateRequest | dict[str, object]] = [
        GenerateRequest(prompt="a red fox", seed=1),
        {"prompt": "a blue whale", "n": 2, "seed": 2},
        {"prompt": f"please {EXPLODE_MARKER}", "seed": 3},
        {"prompt": "a very slow owl", "num_inference_steps": TOO_MANY_STEPS},
        {"prompt": "a small tile", "width": 32, "height": 32},
    ]
    with Client(fleet.base_url) as client:
        results = client.generate(requests, timeout=120, num_inference_steps=4)
    fox, whale, exploded, refused, tile = results

    for result, n, size in ((fox, 1, (64, 64)), (whale, 2, (64, 64)), (tile, 1, (32, 32))):
        assert result.ok, (result.error, fleet.logs_hint())
        assert result.id is not None and result.status is RequestStatus.SUCCEEDED
        assert [_size(png) for png in result.images] == [size] * n
        assert result.view is not None and result.view.worker is not None
    assert whale.images[0] != whale.images[1]

    assert exploded.id is not None and exploded.status is RequestStatus.FAILED
    assert exploded.error is not None and exploded.error.type == "ValueError"
    assert f"request {exploded.id} asked the pipeline to {EXPLODE_MARKER}" in exploded.error.message
    assert exploded.images == []

    assert refused.id is None and refused.status is None
    assert refused.error is not None and refused.error.type == "RequestRejected"
    assert refused.error.field == "num_inference_steps" and "max_inference_steps" in refused.error.message


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_async_generate_reports_progress(fleet: Fleet) -> None:
    seen: dict[int, list[RequestView]] = {}
    async with AsyncClient(fleet.base_url) as client:
        results = await client.generate(
            ["a quiet forest", "an old town"],
            timeout=120,
            on_progress=lambda i, view: seen.setdefault(i, []).append(view),
            num_inference_steps=8,
        )
    assert [r.status for r in results] == [RequestStatus.SUCCEEDED] * 2, [r.error for r in results]
    for i, result in enumerate(results):
        views = seen[i]
        assert views[-1].status is RequestStatus.SUCCEEDED and views[-1].progress.total == 8
        assert all(view.id == result.id for view in views)
        assert len(result.images) == 1


def test_cli_generate_writes_the_pngs(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _cli(
        fleet,
        "a red fox",
        "a blue whale",
        "-n",
        "2",
        "--size",
        "64x64",
        "--steps",
        "4",
        "--seed",
        "1",
        "--guidance",
        "5",
        "--negative",
        "blurry",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr + fleet.logs_hint()
    written = done.stdout.split()
    assert len(written) == 4
    assert sorted(written) == sorted(str(path) for path in out.glob("*.png"))
    names = [Path(path).name for path in written]
    ids = {name.rsplit("-", 1)[0] for name in names}
    assert len(ids) == 2 and all(len(rid) == 32 for rid in ids)
    assert {name.rsplit("-", 1)[1] for name in names} == {"0.png", "1.png"}
    assert all(_size(Path(path).read_bytes()) == (64, 64) for path in written)
    for rid in ids:
        params = fleet.get(rid)["params"]
        assert (params["seed"], params["negative_prompt"], params["n"]) == (1, "blurry", 2)


def test_cli_generate_reports_failures_and_exits_1(fleet: Fleet, tmp_path: Path) -> None:
    done = _cli(fleet, "a calm sea", f"please {EXPLODE_MARKER}", "--prefix", "sea", "-o", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.split() == [str(tmp_path / "sea-0-0.png")]
    assert (tmp_path / "sea-0-0.png").is_file()
    error = " ".join(done.stderr.split())
    assert f"prompt 1 'please {EXPLODE_MARKER}'" in error and "ValueError" in error and "explode" in error
    assert "Traceback" not in done.stderr

    refused = _cli(fleet, "a calm sea", "--steps", str(TOO_MANY_STEPS), "-o", str(tmp_path / "none"))
    assert refused.returncode == 1
    error = " ".join(refused.stderr.split())
    assert "was refused: RequestRejected: num_inference_steps: Input should be less than or equal to 5000" in error
    assert "Traceback" not in refused.stderr and refused.stdout == ""
    assert not (tmp_path / "none").exists()


@needs_image_fields
def test_image_to_image_and_inpainting_through_the_client_and_the_cli(fleet: Fleet, tmp_path: Path) -> None:
    source, mask = tmp_path / "in.png", tmp_path / "mask.webp"
    Image.new("RGB", (64, 64), (20, 120, 220)).save(source)
    Image.new("L", (32, 32), 255).save(mask)  # another size and format: the api converts and resizes it
    with Client(fleet.base_url) as client:
        request = GenerateRequest.model_validate(
            {"prompt": "a watercolour fox", "image": encode_image(source), "strength": 0.6, "seed": 4}
        )
        [result] = client.generate([request], timeout=120)
    assert result.ok, (result.error, fleet.logs_hint())
    assert result.view is not None
    assert (result.view.params.task, result.view.params.strength) == ("image-to-image", 0.6)
    assert [_size(png) for png in result.images] == [(64, 64)]

    done = _cli(
        fleet,
        "a fox",
        "--image",
        str(source),
        "--mask",
        str(mask),
        "--strength",
        "0.7",
        "--prefix",
        "fox",
        "-o",
        str(tmp_path / "out"),
    )
    assert done.returncode == 0, done.stdout + done.stderr + fleet.logs_hint()
    assert done.stdout.split() == [str(tmp_path / "out" / "fox-0-0.png")]
    assert _size((tmp_path / "out" / "fox-0-0.png").read_bytes()) == (64, 64)
