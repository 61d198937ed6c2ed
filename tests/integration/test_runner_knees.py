"""The runner measures its own batch knee: each forward that ran all its steps is one measurement of its size at
its requests' pixel cost (one stopped early is none), and the table is kept per model and device on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.families import family_runner, family_specs
from gpu_worker.batch_knee import KneeTable
from shared.compat import pixel_cost

pytestmark = pytest.mark.timeout(300)


def test_forwards_feed_the_knee_table(tmp_path: Path) -> None:
    runner = family_runner("stable-diffusion", tmp_path)
    specs = family_specs("stable-diffusion", ["a", "b", "c"], side=32, steps=2, seed=1, negative="n")
    cost = str(pixel_cost(specs[0]))
    runner.run(specs[:1], lambda step, total: False)
    runner.run(specs, lambda step, total: False)
    runner.run(specs[:2], lambda step, total: True)  # stopped at its first step: not a measurement
    assert set(runner.knees.seconds(cost)) == {1, 3}
    (knee,) = runner.batch_knees(margin=0.0)
    assert knee.cost == int(cost) and knee.knee in (1, 3)
    runner.knees.save()
    assert runner.knees.path is not None and runner.knees.path.is_relative_to(tmp_path)
    assert set(KneeTable(runner.knees.path).seconds(cost)) == {1, 3}
