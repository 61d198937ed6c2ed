"""The largest step count a scheduler takes (``gpu_worker.step_limit``), which workers announce as
``ModelTraits.max_inference_steps``: found by dry runs on a copy, and what it means checked with the scheduler's own
``step`` (the call diffusers' pipelines make at every step)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from gpu_worker.step_limit import largest_step_count  # noqa: E402

SD_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "steps_offset": 1,
}
"""Stable Diffusion 1.x's scheduler config (DDIM's ``leading`` spacing, offset 1)."""


def denoise(scheduler: Any, steps: int) -> torch.Tensor:
    """Every step of a ``steps``-step run on a tiny sample, as a pipeline steps (the noise prediction made up)."""
    scheduler.set_timesteps(steps)
    sample = torch.ones(1, 1, 2, 2)
    for timestep in scheduler.timesteps:
        if hasattr(scheduler, "scale_model_input"):
            sample = scheduler.scale_model_input(sample, timestep)
        sample = scheduler.step(torch.zeros_like(sample), timestep, sample).prev_sample
    return sample


def test_ddim_of_stable_diffusion_takes_999_steps_and_fails_at_1000() -> None:
    scheduler = diffusers.DDIMScheduler(**SD_CONFIG)
    assert largest_step_count(scheduler, 5000) == 999
    assert torch.isfinite(denoise(scheduler, 999)).all()
    with pytest.raises(IndexError):  # what a request of 1000 steps met on a worker before the api refused it
        denoise(scheduler, 1000)


def test_the_pipelines_scheduler_is_left_as_it_was() -> None:
    scheduler = diffusers.DDIMScheduler(**SD_CONFIG)
    scheduler.set_timesteps(30)
    before = scheduler.timesteps.clone()
    largest_step_count(scheduler, 5000)
    assert torch.equal(scheduler.timesteps, before)


def test_a_limit_at_or_above_the_fleets_ceiling_is_none() -> None:
    assert largest_step_count(diffusers.DDIMScheduler(**SD_CONFIG), 999) is None
    assert largest_step_count(diffusers.DDIMScheduler(**SD_CONFIG), 1000) == 999
    assert largest_step_count(diffusers.DDIMScheduler(**SD_CONFIG), 200) is None


@pytest.mark.parametrize(
    ("scheduler", "limit"),
    [
        (diffusers.PNDMScheduler(**SD_CONFIG), 999),  # fails at 1000 (yet runs 5000)
        (diffusers.DPMSolverMultistepScheduler(**SD_CONFIG), 999),  # NaN at 1000 (a repeated timestep), fails at 5000
        (diffusers.LCMScheduler(**SD_CONFIG), 50),  # refuses more than its original_inference_steps
        (diffusers.EulerDiscreteScheduler(**SD_CONFIG), 1000),  # runs 5000, but has 1000 timesteps
    ],
    ids=["pndm", "dpm-solver", "lcm", "euler"],
)
def test_a_discrete_scheduler_runs_no_more_steps_than_its_schedule_has_timesteps(scheduler: Any, limit: int) -> None:
    assert largest_step_count(scheduler, 5000) == limit
    assert torch.isfinite(denoise(scheduler, limit)).all()


def test_a_flow_matching_scheduler_is_tried_at_the_fleets_ceiling() -> None:
    assert largest_step_count(diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0), 5000) is None


def test_past_its_limit_a_run_fails_or_ends_in_nan() -> None:
    dpm = diffusers.DPMSolverMultistepScheduler(**SD_CONFIG)
    assert torch.isnan(denoise(dpm, 1000)).all()
    with pytest.raises(IndexError):  # why the training schedule's length bounds every scheduler's count
        denoise(dpm, 5000)
    with pytest.raises(ValueError, match="smaller than `num_inference_steps`: 51"):
        denoise(diffusers.LCMScheduler(**SD_CONFIG), 51)


def test_what_cannot_be_told_announces_no_limit() -> None:
    assert largest_step_count(None, 200) is None  # a pipeline without a scheduler
    # a flow-matching scheduler that needs the image's mu runs no count on its own
    assert largest_step_count(diffusers.FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), 200) is None
