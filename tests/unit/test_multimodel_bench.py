"""The multi-model benchmark's pure parts: the hand split of the pool, the arrivals plan, the sustained point, the
simulated load cost, and its docs section."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from bench.multimodel import (
    MIXES,
    SECTION,
    MultiModelConfig,
    arrivals,
    replace_section,
    split_workers,
    sustained,
)
from bench.runners import SimulatedGpuRunner, SimulatedGpuSettings
from shared.settings import Settings


def test_split_is_proportional_with_one_worker_each_at_least() -> None:
    assert split_workers((0.7, 0.2, 0.1), 4) == [2, 1, 1]
    assert split_workers((0.7, 0.2, 0.1), 10) == [7, 2, 1]
    assert split_workers((1 / 3, 1 / 3, 1 / 3), 4) == [2, 1, 1]
    assert split_workers((0.9, 0.05, 0.05), 3) == [1, 1, 1]
    assert sum(split_workers((0.5, 0.3, 0.2), 7)) == 7


def test_split_refuses_fewer_workers_than_models() -> None:
    with pytest.raises(ValueError, match="workers"):
        split_workers((0.5, 0.3, 0.2), 2)


def test_shifting_arrivals_follow_the_hot_model_of_each_phase() -> None:
    plan = arrivals(200.0, 30.0, MIXES["shifting"], 10.0, seed=1)
    assert plan == arrivals(200.0, 30.0, MIXES["shifting"], 10.0, seed=1)  # one seeded plan for both systems
    assert all(0 <= offset < 30.0 for offset, _ in plan)
    for phase, hot in enumerate(("m0", "m1", "m2")):
        models = Counter(model for offset, model in plan if phase * 10 <= offset < (phase + 1) * 10)
        assert models.most_common(1)[0][0] == hot
        assert 0.6 < models[hot] / sum(models.values()) < 0.8
    assert MIXES["shifting"].average == pytest.approx((1 / 3, 1 / 3, 1 / 3))


def _point(rps: float, p99: float, failed: int = 0) -> dict[str, Any]:
    return {"throughput_rps": rps, "latency_s": {"p99": p99}, "requests": 10, "succeeded": 10 - failed}


def test_sustained_is_the_heaviest_point_inside_the_bound_without_failures() -> None:
    points = [_point(5.0, 1.0), _point(9.0, 4.0), _point(12.0, 9.0), _point(11.0, 2.0, failed=1)]
    assert sustained(points, 5.0) == points[1]
    assert sustained(points, 0.5) is None


def test_config_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="mixes"):
        MultiModelConfig(mixes=("steady",))
    with pytest.raises(ValueError, match="resident"):
        MultiModelConfig(resident=0)
    with pytest.raises(ValueError, match="workers"):
        MultiModelConfig(workers=2)


def test_config_scales_the_load_and_the_residency_with_the_cost_model() -> None:
    env = MultiModelConfig(scale=0.5, load_s=6.0, min_residency_s=10.0).env()
    assert float(env["FUSEFLEET_SIM_LOAD_MS"]) == 3000.0
    assert float(env["FUSEFLEET_MIN_RESIDENCY_S"]) == 5.0
    assert float(env["FUSEFLEET_SIM_BASE_MS"]) == pytest.approx(531.4 / 2, abs=0.1)


def test_the_simulated_load_is_paid_on_construction_only_when_set() -> None:
    started = time.monotonic()
    SimulatedGpuRunner(Settings(), SimulatedGpuSettings(sim_load_ms=200.0))
    loaded = time.monotonic() - started
    started = time.monotonic()
    SimulatedGpuRunner(Settings(), SimulatedGpuSettings())
    assert loaded >= 0.2 > time.monotonic() - started


def test_the_section_is_replaced_in_place_and_other_sections_are_kept() -> None:
    document = f"# Benchmarks\n\n## Other\n\nkept\n\n{SECTION}\n\nold\n\n## After\n\nkept too\n"
    updated = replace_section(document, f"{SECTION}\n\nnew\n")
    assert "old" not in updated and "new" in updated
    assert updated.index("## Other") < updated.index(SECTION) < updated.index("## After")
    assert replace_section("# B\n", f"{SECTION}\n\nnew\n").endswith(f"{SECTION}\n\nnew\n")
