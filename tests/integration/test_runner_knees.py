"""The runner measures its own batch knee: each forward that ran all its steps is one measurement of its size at
its requests' pixel cost (one stopped early is none), the sizes of batch_knee_warmup are timed at start, and the
table is kept per model and device on disk."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bench.families import family_runner, family_specs
from gpu_worker.batch_knee import KneeTable
from gpu_worker.diffusers_runner import DiffusersRunner
from shared.compat import pixel_cost
from shared.settings import Settings

pytestmark = pytest.mark.timeout(300)


def test_forwards_feed_the_knee_table(tmp_path: Path) -> None:
    runner = family_runner("stable-diffusion", tmp_path)
    specs = family_specs("stable-diffusion", ["a", "b", "c"], side=32, steps=2, seed=1, negative="n")
    cost = str(pixel_cost(specs[0]))
    runner.run(specs[:1], lambda step, total: False)
    runner.run(specs, lambda step, total: False)
    runner.run(specs[:2], lambda step, total: True)  # stopped at its first step: not a measurement
    assert set(runner.knees.seconds(cost)) == {1, 3}
    assert runner.batch_knees(margin=0.0) == ()  # a CPU worker announces none unless batch_knee_cap says so
    runner.settings = runner.settings.model_copy(update={"batch_knee_cap": True})
    (knee,) = runner.batch_knees(margin=0.0)
    assert knee.cost == int(cost) and knee.knee in (1, 3)
    runner.knees.save()
    assert runner.knees.path is not None and runner.knees.path.is_relative_to(tmp_path)
    assert set(KneeTable(runner.knees.path).seconds(cost)) == {1, 3}


def test_the_start_up_measurement_times_each_size_once_per_model_and_device(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(
        model=None, model_cache_dir=tmp_path, max_num_seqs=3, batch_knee_warmup="32x32"
    )
    caplog.set_level(logging.INFO, logger="gpu_worker.diffusers_runner")
    runner = DiffusersRunner(settings)
    assert set(runner.knees.seconds(str(32 * 32))) == {1, 2, 3}  # the warm-up forward is not a measurement
    assert "measuring the batch knee of StableDiffusionPipeline at 32x32" in caplog.text
    caplog.clear()
    again = DiffusersRunner(settings)  # a restart: the table on disk, nothing timed
    assert again.knees.seconds(str(32 * 32)) == runner.knees.seconds(str(32 * 32))
    assert "measuring" not in caplog.text


def test_with_buckets_the_first_forward_of_a_shape_is_no_measurement_and_start_up_warms_every_bucket(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = family_runner("stable-diffusion", tmp_path)
    runner.buckets = (1, 2, 4)  # as a compiled denoiser's: the first forward of each bucket compiles it
    specs = family_specs("stable-diffusion", ["a", "b", "c"], side=32, steps=2, seed=1, negative="n")
    cost = str(pixel_cost(specs[0]))
    runner.run(specs, lambda step, total: False)  # bucket 4 at 32 px, first: not a measurement
    assert runner.knees.seconds(cost) == {}
    runner.run(specs, lambda step, total: False)
    assert set(runner.knees.seconds(cost)) == {3}

    caplog.set_level(logging.INFO, logger="gpu_worker.diffusers_runner")
    runner.measure_knees([(48, 48)], (1, 2, 4))  # a new shape: every bucket warmed first, then each size timed
    assert caplog.text.count("compiled StableDiffusionPipeline for") == 3
    assert set(runner.knees.seconds(str(48 * 48))) == {1, 2, 4}
    caplog.clear()
    timed = runner.knees.seconds(str(48 * 48))
    runner._shapes_run.clear()  # as after a restart: the table on disk, nothing compiled yet
    runner.measure_knees([(48, 48)], (1, 2, 4))
    assert caplog.text.count("compiled StableDiffusionPipeline for") == 3 and "measuring" not in caplog.text
    assert runner.knees.seconds(str(48 * 48)) == timed  # the warm-up forwards (first of their shapes) not folded in
