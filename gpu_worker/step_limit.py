"""The largest ``num_inference_steps`` a model's scheduler takes, announced as ``ModelTraits.max_inference_steps`` so
that the api refuses a larger one with a 422 naming the field, instead of the request failing on a worker.

A scheduler trained on ``num_train_timesteps`` timesteps (1000 for Stable Diffusion) spreads a run's steps over them;
past that many steps some spacings index beyond the schedule: DDIM's ``leading`` spacing with ``steps_offset`` 1
(Stable Diffusion 1.x's) sets timestep 1000 of a 1000-entry schedule for 1000 steps, and diffusers' own pipeline
call then fails with an ``IndexError`` (so does the step engine), PNDM fails there too, DPM-Solver++ and UniPC fail
further on (at 5000). What a scheduler takes is found by running it: a dry run sets the timesteps and steps through
every one on a tiny sample with a made-up noise prediction, on a fresh copy of the scheduler (from its config: the
pipeline's own is left as it was). The count tried first is, for a discrete scheduler (one that indexes
``alphas_cumprod``), its training schedule's length (or the fleet's ``max_inference_steps`` when lower): no more steps
are announced than it has timesteps, however many a spacing would take (PNDM fails at 1000 yet runs 5000), so that
one dry run decides for most schedulers; a continuous one (flow matching) is tried at the fleet's ceiling. One that
fails is tried one step shorter, then bisected. A dry run costs about 0.1 ms a step on a CPU (0.02-0.8 s at 1000
steps), once per model load.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


def _takes(scheduler: Any, steps: int) -> bool:
    """Whether a fresh copy of ``scheduler`` runs every step of a ``steps``-step run to a finite sample (a dry
    run)."""
    try:
        probe = type(scheduler).from_config(scheduler.config)
        probe.set_timesteps(steps, device="cpu")
        sample = torch.ones(1, 1, 2, 2)
        for timestep in probe.timesteps:
            if hasattr(probe, "scale_model_input"):
                sample = probe.scale_model_input(sample, timestep)
            sample = probe.step(torch.zeros_like(sample), timestep, sample, return_dict=False)[0]
    except Exception:  # noqa: BLE001 - any failure (an index past the schedule, a refusal, missing arguments) says no
        return False
    return bool(torch.isfinite(sample).all())  # repeated timesteps make some solvers divide by a zero step


def largest_step_count(scheduler: Any, ceiling: int) -> int | None:
    """The largest step count ``scheduler`` takes, a discrete one's at most its training schedule's length; None
    when that is at least ``ceiling`` (the fleet's ``max_inference_steps``: nothing more to refuse), or when it
    cannot be told (no config, no schedule length, or no count runs at all on its own: a flow-matching scheduler
    that needs the image's ``mu``, say): nothing is refused then."""
    config = getattr(scheduler, "config", None)
    trained = getattr(config, "num_train_timesteps", None) if config is not None else None
    if not isinstance(trained, int) or trained < 1 or not hasattr(type(scheduler), "from_config"):
        return None
    # a discrete schedule is indexed by its timesteps: no more steps than it has entries; a continuous one (flow
    # matching: sigmas, no alphas_cumprod) is tried at the ceiling itself
    top = min(ceiling, trained) if hasattr(scheduler, "alphas_cumprod") else ceiling
    if _takes(scheduler, top):
        return None if top == ceiling else top
    if top > 1 and _takes(scheduler, top - 1):
        return top - 1
    if not _takes(scheduler, 1):
        log.info("%s runs no step count on its own: no step limit announced", type(scheduler).__name__)
        return None
    taken, refused = 1, top - 1
    while refused - taken > 1:
        middle = (taken + refused) // 2
        if _takes(scheduler, middle):
            taken = middle
        else:
            refused = middle
    return taken
