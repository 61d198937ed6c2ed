"""Runners plugged into real workers by import path (``FUSEFLEET_RUNNER``) in tests.

``ExplodingRunner`` (the real diffusers runner plus a fault) is imported on first use only, so workers running
the placeholder runners here (``ChaosRunner``) never import torch.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any

from PIL import Image

from bench.runners import NullRunner, SimulatedGpuRunner
from gpu_worker.runner import InputImages, StepCallback
from shared.contracts import RequestSpec

EXPLODE_MARKER = "explode"


def __getattr__(name: str) -> Any:
    if name == "ExplodingRunner":
        from tests.support.diffusers_runners import ExplodingRunner

        return ExplodingRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- fault injection --------------------------------------------------------------------------------------------
RAISE_BEFORE = "chaos:raise-before"
RAISE_DURING = "chaos:raise-during"
RAISE_AFTER = "chaos:raise-after"
WRONG_LISTS = "chaos:wrong-lists"
WRONG_COUNT = "chaos:wrong-count"
NOT_AN_IMAGE = "chaos:not-an-image"
PNG_FAILS = "chaos:png-fails"
KILL_WORKER = "chaos:kill-worker"
CHAOS_MARKERS = (RAISE_BEFORE, RAISE_DURING, RAISE_AFTER, WRONG_LISTS, WRONG_COUNT, NOT_AN_IMAGE, PNG_FAILS)


class FullSizeRunner(NullRunner):
    """``NullRunner`` with full-size images (noise over a gradient, like a photo as far as PNG is concerned): what a
    real model's results weigh in the result store, with no forward to wait for."""

    def run(
        self, specs: Sequence[RequestSpec], on_step: StepCallback, inputs: Mapping[str, InputImages] | None = None
    ) -> list[list[Image.Image]]:
        out: list[list[Image.Image]] = []
        for spec in specs:
            size = (spec.width, spec.height)
            gradient = Image.linear_gradient("L").resize(size).convert("RGB")
            noise = Image.frombytes("RGB", size, os.urandom(size[0] * size[1] * 3))
            out.append([Image.blend(gradient, noise, 0.25) for _ in range(spec.n)])
        return out


class ChaosError(RuntimeError):
    """What ``ChaosRunner`` raises when a prompt asks it to."""


def unique_images(specs: Sequence[RequestSpec]) -> list[list[Image.Image]]:
    """``spec.n`` tiny noise images per spec, different on every call: a later run never reproduces them, so a
    stale run that overwrote a stored result would show as changed PNG bytes."""
    out: list[list[Image.Image]] = []
    for spec in specs:
        size = (min(8, spec.width), min(8, spec.height))
        out.append([Image.frombytes("RGB", size, os.urandom(size[0] * size[1] * 3)) for _ in range(spec.n)])
    return out


class ChaosRunner(SimulatedGpuRunner):
    """``SimulatedGpuRunner`` timing (``FUSEFLEET_SIM_*``; 0 = instant) and per-run noise images, plus faults
    asked for by markers in a prompt (each hits the whole forward the marked request is in, fused or alone):

    - ``chaos:raise-before``: raises ``ChaosError`` before the first denoising step;
    - ``chaos:raise-during``: raises ``ChaosError`` from inside the step loop (after step 1 was reported);
    - ``chaos:raise-after``: raises ``ChaosError`` after the last step;
    - ``chaos:wrong-lists``: returns one list fewer than specs (one more when run alone);
    - ``chaos:wrong-count``: returns ``n + 1`` images for the marked request;
    - ``chaos:not-an-image``: returns a string instead of an image for the marked request;
    - ``chaos:png-fails``: returns a CMYK image for the marked request (a real image PNG cannot encode);
    - ``chaos:kill-worker``: the process kills itself with SIGKILL after step 1 was reported (a segfault, the OOM
      killer), which no code in it can catch.
    """

    fused = True

    def run(
        self, specs: Sequence[RequestSpec], on_step: StepCallback, inputs: Mapping[str, InputImages] | None = None
    ) -> list[list[Image.Image]]:
        def marked(marker: str) -> str | None:
            return next((spec.id for spec in specs if marker in spec.prompt), None)

        if culprit := marked(RAISE_BEFORE):
            raise ChaosError(f"chaos: request {culprit} raised before the forward")
        steps = specs[0].num_inference_steps
        step_s = self.cost_s(sum(spec.n for spec in specs)) / steps
        deadline = time.monotonic()
        for step in range(1, steps + 1):
            if step == 2 and (culprit := marked(RAISE_DURING)):
                raise ChaosError(f"chaos: request {culprit} raised during the forward, at step {step}")
            deadline += step_s
            time.sleep(max(0.0, deadline - time.monotonic()))
            if on_step(step, steps):
                break
            if step == 1 and marked(KILL_WORKER):
                os.kill(os.getpid(), signal.SIGKILL)
        if (culprit := marked(RAISE_DURING)) and steps < 2:
            raise ChaosError(f"chaos: request {culprit} raised during the forward, at its only step")
        if culprit := marked(RAISE_AFTER):
            raise ChaosError(f"chaos: request {culprit} raised after the forward")
        images: list[list[Any]] = [list(imgs) for imgs in unique_images(specs)]
        for i, spec in enumerate(specs):
            if WRONG_COUNT in spec.prompt:
                images[i].append(images[i][0])
            if NOT_AN_IMAGE in spec.prompt:
                images[i] = ["chaos: not an image"] * spec.n
            if PNG_FAILS in spec.prompt:
                images[i] = [Image.new("CMYK", (8, 8))] * spec.n
        if marked(WRONG_LISTS):
            images = images[:-1] if len(images) > 1 else images * 2
        return images
