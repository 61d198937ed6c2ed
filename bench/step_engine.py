"""Measurements of the step engine on the tiny demo pipelines (CPU or GPU, float32):
``python -m bench.step_engine speed`` and ``python -m bench.step_engine equality`` (docs/step_mode.md).

* ``speed``: for each row count R, *fused* is one engine stepping R guided rows (one denoiser call of 2R rows per
  step); *serial* is R engines of one row each, stepped one after another (R calls of 2 rows). Both report the
  mean wall time of one step of all R rows, after one warm-up step.
* ``equality``: for each scheduler, four rows with different steps, guidance scales, rescales and negative prompts
  joining at steps 0, 1, 2 and 3, against the standard pipeline call of each row alone: the largest latent and
  pixel differences of a row run alone in the engine, of the rows in the running set, and (for scale) of the
  request-level fused call of two rows.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gpu_worker.families import family_of
from gpu_worker.step_engine.engine import ADAPTERS, StepEngine
from gpu_worker.step_engine.rows import Finished, Row

FAMILIES = tuple(ADAPTERS)
SD_SCHEDULERS = (
    "DDIMScheduler",
    "EulerDiscreteScheduler",
    "EulerAncestralDiscreteScheduler",
    "DPMSolverMultistepScheduler",
    "HeunDiscreteScheduler",
    "DDPMScheduler",
)


@dataclass(frozen=True, slots=True)
class Measurement:
    """Mean seconds per step of ``rows`` rows, fused and serial."""

    rows: int
    fused_s: float
    serial_s: float


def _rows(count: int, steps: int, device: torch.device) -> list[Row]:
    return [
        Row(f"bench-{i}", "a red fox", steps, 5.0, torch.Generator(device).manual_seed(i), negative_prompt="blurry")
        for i in range(count)
    ]


def _per_step(engines: Sequence[StepEngine], steps: int) -> float:
    """Mean seconds to step every engine once, over ``steps`` rounds after a warm-up round."""
    for engine in engines:
        engine.step()
    start = time.perf_counter()
    for _ in range(steps):
        for engine in engines:
            engine.step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def measure(pipe: Any, rows: Sequence[int], steps: int, side: int) -> list[Measurement]:
    """Fused and serial per-step time for each row count in ``rows`` (``steps`` timed steps each)."""
    device = pipe._execution_device
    results = []
    for count in rows:
        fused = StepEngine(pipe, side, side)
        fused.join(_rows(count, steps + 1, device))
        serial = [StepEngine(pipe, side, side) for _ in range(count)]
        for engine, row in zip(serial, _rows(count, steps + 1, device), strict=True):
            engine.join([row])
        results.append(Measurement(count, _per_step([fused], steps), _per_step(serial, steps)))
    return results


# (prompt, negative prompt, steps, guidance scale, guidance rescale), seeded 1, 2, 3, 4
EQUALITY_ROWS = (
    ("a red fox", "blurry", 4, 5.0, 0.0),
    ("a blue whale in the sea", None, 3, 1.0, 0.0),
    ("a lighthouse", None, 6, 7.5, 0.7),
    ("a tree", "a dog", 2, 2.0, 0.0),
)


def _row(i: int, device: torch.device) -> Row:
    prompt, negative, steps, guidance, rescale = EQUALITY_ROWS[i]
    generator = torch.Generator(device).manual_seed(i + 1)
    return Row(f"r{i}", prompt, steps, guidance, generator, negative_prompt=negative, guidance_rescale=rescale)


def _pipeline(pipe: Any, side: int, rows: Sequence[Row]) -> tuple[torch.Tensor, np.ndarray]:
    """The standard call of ``rows`` (sharing steps and guidance): final latents (step-end callback), pixels."""
    import inspect

    final: list[torch.Tensor] = []

    def keep(pipe: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        final[:] = [tensors["latents"].clone()]
        return tensors

    def keep_latents(step: int, timestep: Any, latents: torch.Tensor) -> None:  # the older callback (PixArt)
        final[:] = [latents.clone()]

    head = rows[0]
    accepts = inspect.signature(pipe.__call__).parameters
    kwargs: dict[str, Any] = {name: value for name, value in family_of(pipe).fixed_kwargs.items() if name in accepts}
    if "callback_on_step_end" in accepts:
        kwargs["callback_on_step_end"] = keep
    else:
        kwargs.update(callback=keep_latents, callback_steps=1)
    if head.negative_prompt is not None:
        kwargs["negative_prompt"] = [row.negative_prompt for row in rows]
    if head.guidance_rescale and family_of(pipe).traits.guidance_rescale:
        kwargs["guidance_rescale"] = head.guidance_rescale
    images = pipe(
        prompt=[row.prompt for row in rows],
        generator=[row.generator for row in rows],
        num_inference_steps=head.steps,
        guidance_scale=head.guidance_scale,
        width=side,
        height=side,
        **kwargs,
    ).images
    return final[0], np.stack([np.asarray(image, dtype=np.int16) for image in images])


def _engine(pipe: Any, side: int, joins: dict[int, list[Row]]) -> dict[str, tuple[torch.Tensor, np.ndarray]]:
    engine = StepEngine(pipe, side, side)
    finished: list[Finished] = []
    step = 0
    while len(engine) or any(k >= step for k in joins):
        engine.join(joins.get(step, []))
        finished += engine.step()
        step += 1
    images = engine.decode(finished)
    return {d.row.id: (d.latents, np.asarray(im, dtype=np.int16)) for d, im in zip(finished, images, strict=True)}


def _differences(got: tuple[torch.Tensor, np.ndarray], want: tuple[torch.Tensor, np.ndarray]) -> tuple[float, int]:
    latent = float((got[0] - want[0]).abs().max() / want[0].abs().max())
    return latent, int(np.abs(got[1] - want[1]).max())


def equality(pipe: Any, side: int) -> dict[str, tuple[float, int]]:
    """Largest relative latent difference and pixel difference (of 255) from the rows' solo pipeline calls:
    ``solo`` (each row alone in the engine), ``set`` (all four, joining at steps 0-3), ``request-level`` (the
    fused pipeline call of the first row and a second row of the same steps and guidance)."""
    device = pipe._execution_device
    count = len(EQUALITY_ROWS)
    ids = [(i, f"r{i}/0") for i in range(count)]
    alone = {row_id: _pipeline(pipe, side, [_row(i, device)]) for i, row_id in ids}
    solo = [_differences(_engine(pipe, side, {0: [_row(i, device)]})[row_id], alone[row_id]) for i, row_id in ids]
    running = _engine(pipe, side, {i: [_row(i, device)] for i in range(count)})
    in_set = [_differences(running[row_id], alone[row_id]) for row_id in alone]
    peer = Row("peer", "a cat", 4, 5.0, torch.Generator(device).manual_seed(9), negative_prompt="x")
    latents, pixels = _pipeline(pipe, side, [_row(0, device), peer])
    fused = _differences((latents[:1], pixels[:1]), alone["r0/0"])
    return {
        "solo": (max(d[0] for d in solo), max(d[1] for d in solo)),
        "set": (max(d[0] for d in in_set), max(d[1] for d in in_set)),
        "request-level": fused,
    }


def _load(family: str, device: str) -> Any:
    from demo_models import demo_builder
    from demo_models.components import eval_modules

    pipe = eval_modules(demo_builder(family)()).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="step engine measurements on the tiny demo pipelines")
    parser.add_argument("what", choices=["speed", "equality"])
    parser.add_argument("--family", default="stable-diffusion", choices=FAMILIES)
    parser.add_argument("--rows", default="1,2,4,8,16", help="speed: comma-separated row counts")
    parser.add_argument("--steps", type=int, default=10, help="speed: timed steps per row count")
    parser.add_argument("--side", type=int, default=32, help="image width and height")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    pipe = _load(args.family, args.device)
    print(f"{args.family} tiny demo pipeline, {args.side}x{args.side}, {args.device}, torch {torch.__version__}")
    if args.what == "speed":
        print(f"{'rows':>5} {'fused ms/step':>14} {'serial ms/step':>15} {'serial/fused':>13}")
        for m in measure(pipe, [int(r) for r in args.rows.split(",")], args.steps, args.side):
            print(f"{m.rows:>5} {m.fused_s * 1e3:>14.2f} {m.serial_s * 1e3:>15.2f} {m.serial_s / m.fused_s:>13.2f}")
        return
    import diffusers

    schedulers = SD_SCHEDULERS if args.family == "stable-diffusion" else (type(pipe.scheduler).__name__,)
    loaded = pipe.scheduler
    print(f"{'scheduler':<34} {'solo':>18}  {'running set':>18}  {'request-level':>18}")
    print(f"{'':<34} {'(max |d latent| / max |latent|, max |d pixel|)':>58}")
    for name in schedulers:
        pipe.scheduler = getattr(diffusers, name).from_config(loaded.config)
        cells = [f"{lat:>10.1e} {px:>3}/255" for lat, px in equality(pipe, args.side).values()]
        print(f"{name:<34} {'  '.join(cells)}")
    pipe.scheduler = loaded


if __name__ == "__main__":
    main()
