"""``RequestSet`` (the worker's running set of requests over the step engine) on the tiny Stable Diffusion demo
pipeline, loaded as the worker loads it (float32, CPU): requests of other step counts, guidance scales and output
counts share a set and each finishes at its own step with the images of its solo pipeline call (within 1/255); a
refused join reports only the refused request; an aborted request leaves and its peers are unaffected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from demo_models import ensure_demo_model  # noqa: E402
from gpu_worker.diffusers_runner import absent_components  # noqa: E402
from gpu_worker.runner import StepSet  # noqa: E402
from gpu_worker.step_engine import StepEngine, step_key  # noqa: E402
from gpu_worker.step_engine.request_set import RequestSet  # noqa: E402
from shared.contracts import RequestSpec  # noqa: E402
from tests.support.specs import demo_spec  # noqa: E402

SIDE = 32
PIXEL_TOLERANCE = 1  # of 255: rows in a set differ from their solo call by float rounding only (docs/step_mode.md)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/unit/conftest.py


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    source = str(ensure_demo_model(Path(tmp_path_factory.mktemp("request-set-model")), "stable-diffusion"))
    loaded = diffusers.DiffusionPipeline.from_pretrained(source, **absent_components(source))
    loaded.set_progress_bar_config(disable=True)
    return loaded


def spec(
    rid: str, steps: int, guidance: float, *, n: int = 1, seed: int = 1, negative: str | None = None
) -> RequestSpec:
    return demo_spec(rid, steps, guidance, side=SIDE, n=n, seed=seed, negative=negative)


def new_set(pipe: Any, first: RequestSpec) -> RequestSet:
    step_set = RequestSet(StepEngine.for_key(pipe, step_key(first)))
    _: StepSet = step_set  # what the worker's loop takes (the type checker checks it)
    return step_set


def joined(pipe: Any, *requests: RequestSpec) -> RequestSet:
    """A new set on the first request's step key that all of ``requests`` joined (none refused)."""
    step_set = new_set(pipe, requests[0])
    assert step_set.join(list(requests)) == {}
    return step_set


def solo(pipe: Any, request: RequestSpec) -> list[np.ndarray]:
    """The request's images from the standard pipeline, one call per output (output k seeded seed + k)."""
    images = []
    for k in range(request.n):
        kwargs = {"negative_prompt": [request.negative_prompt]} if request.negative_prompt is not None else {}
        (image,) = pipe(
            prompt=[request.prompt],
            generator=[torch.Generator().manual_seed(request.seed + k)],
            num_inference_steps=request.num_inference_steps,
            guidance_scale=request.guidance_scale,
            width=SIDE,
            height=SIDE,
            output_type="pil",
            **kwargs,
        ).images
        images.append(np.asarray(image, dtype=np.int16))
    return images


def drain(step_set: RequestSet, joins: dict[int, list[RequestSpec]] | None = None) -> dict[str, tuple[int, list[Any]]]:
    """Step until the set is empty (joining ``joins[k]`` before step ``k``): each request's finishing step (steps
    the set had taken) and its images."""
    joins = joins or {}
    done: dict[str, tuple[int, list[Any]]] = {}
    step = 0
    while step_set.requests or any(k >= step for k in joins):
        assert step_set.join(joins.get(step, [])) == {}
        finished = step_set.step()
        step += 1
        for rid, images in zip(finished, step_set.outputs(finished), strict=True):
            done[rid] = (step, images)
    return done


def assert_solo(pipe: Any, request: RequestSpec, images: list[Any]) -> None:
    expected = solo(pipe, request)
    assert len(images) == request.n
    for k, (image, reference) in enumerate(zip(images, expected, strict=True)):
        difference = int(np.abs(np.asarray(image, dtype=np.int16) - reference).max())
        assert difference <= PIXEL_TOLERANCE, f"{request.id}/{k} differs from its solo call by {difference}/255"


def assert_drain_to_solo(pipe: Any, step_set: RequestSet, *requests: RequestSpec) -> None:
    """Stepped until empty, the set finishes exactly ``requests``, each with its solo images."""
    done = drain(step_set)
    assert set(done) == {request.id for request in requests}
    for request in requests:
        assert_solo(pipe, request, done[request.id][1])


def test_requests_finish_at_their_own_steps_with_their_solo_images(pipe: Any) -> None:
    quick = spec("quick", steps=2, guidance=1.0, n=2, seed=3)
    slow = spec("slow", steps=3, guidance=5.0, seed=4, negative="blurry")
    late = spec("late", steps=2, guidance=5.0, n=2, seed=5)
    step_set = joined(pipe, quick, slow)
    assert step_set.requests == ("quick", "slow")
    assert step_set.progress() == {"quick": (0, 2), "slow": (0, 3)}
    done = drain(step_set, {1: [late]})
    assert {rid: at for rid, (at, _) in done.items()} == {"quick": 2, "slow": 3, "late": 3}
    for request in (quick, slow, late):
        assert_solo(pipe, request, done[request.id][1])
    assert step_set.requests == () and len(step_set.engine) == 0


def test_a_refused_join_reports_only_that_request(pipe: Any) -> None:
    first = spec("first", steps=2, guidance=5.0)
    step_set = joined(pipe, first)
    impossible = spec("impossible", steps=2, guidance=5.0).model_copy(update={"num_inference_steps": 0})
    fine = spec("fine", steps=2, guidance=1.0, seed=9)
    refused = step_set.join([spec("first", steps=3, guidance=1.0), impossible, fine])
    assert set(refused) == {"first", "impossible"}
    assert "already in the running set" in refused["first"]
    assert "steps must be >= 1" in refused["impossible"]
    assert step_set.requests == ("first", "fine")
    assert_drain_to_solo(pipe, step_set, first, fine)


def test_an_aborted_request_leaves_and_its_peers_go_on(pipe: Any) -> None:
    peer = spec("peer", steps=3, guidance=5.0, seed=21)
    victim = spec("victim", steps=3, guidance=5.0, n=2, seed=22)
    step_set = joined(pipe, peer, victim)
    assert step_set.step() == []
    assert step_set.abort("victim")
    assert not step_set.abort("victim")
    assert step_set.requests == ("peer",)
    assert step_set.progress() == {"peer": (1, 3)}
    assert_drain_to_solo(pipe, step_set, peer)


def test_stepping_some_requests_leaves_the_others_where_they_were(pipe: Any) -> None:
    one = spec("one", steps=2, guidance=5.0, seed=31)
    two = spec("two", steps=2, guidance=1.0, seed=32, n=2)
    step_set = joined(pipe, one, two)
    assert step_set.step(only=["two"]) == []
    assert step_set.progress() == {"one": (0, 2), "two": (1, 2)}
    assert step_set.step(only=["two"]) == ["two"]
    assert step_set.progress() == {"one": (0, 2), "two": (2, 2)}  # finished, waiting for its outputs
    with pytest.raises(KeyError):
        step_set.outputs(["one"])
    (images,) = step_set.outputs(["two"])
    assert_solo(pipe, two, images)
    done = drain(step_set)
    assert_solo(pipe, one, done["one"][1])
