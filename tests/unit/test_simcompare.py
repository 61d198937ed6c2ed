"""The pure parts of ``python -m bench simcompare``: load points, figures, tables, the figures file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.peers.simulated_gpu import CostModel
from bench.report import merge_figures
from bench.simcompare import (
    SimConfig,
    cpu_busy,
    figures_of,
    forward_stats,
    load_spec,
    markdown,
    peer_batches,
    ratios,
    steady_images_per_s,
)


def _summary(images_per_s: float, p99: float, p50: float = 0.1, requests: int = 10) -> dict[str, Any]:
    return {
        "images_per_s": images_per_s,
        "latency_s": {"p50": p50, "p99": p99},
        "requests": requests,
        "succeeded": requests,
    }


def test_load_spec_is_the_same_poisson_run_for_everyone() -> None:
    spec = load_spec("mixed", rate=4.0, seconds=20.0)
    assert (spec.pattern, spec.rate, spec.count, spec.steps) == ("poisson", 4.0, 80, 20)
    assert [spec.params(i)["width"] for i in range(4)] == [512, 768, 512, 768]
    assert spec == load_spec("mixed", rate=4.0, seconds=20.0)  # same seed: same arrival times


def test_ratios_are_against_the_best_peer_on_each_axis() -> None:
    points = {
        "fusefleet-grouped": [_summary(5.0, 2.0)],
        "bentoml": [_summary(4.0, 3.0)],
        "litserve": [_summary(4.5, 4.0)],
    }
    got = ratios(points, 0)
    assert got["tput"] == pytest.approx(5.0 / 4.5)  # LitServe has the higher throughput
    assert got["p99"] == pytest.approx(2.0 / 3.0)  # BentoML the lower p99


def test_figures_at_saturation_and_at_80_percent() -> None:
    loads = [0.2, 0.8, 1.5]
    points = {
        "fusefleet-grouped": [_summary(1.0, 1.0), _summary(4.0, 2.0), _summary(6.0, 9.0)],
        "fusefleet-strict": [_summary(1.0, 1.0), _summary(3.0, 5.0), _summary(3.0, 30.0)],
        "bentoml": [_summary(1.0, 1.0), _summary(4.0, 4.0), _summary(5.0, 10.0)],
        "litserve": [_summary(1.0, 1.0), _summary(4.0, 3.0), _summary(4.0, 12.0)],
    }
    figures = figures_of({"mixed": {"points": points}}, loads)
    assert figures == pytest.approx(
        {"P4sim_mixed_tput": 1.2, "P4sim_mixed_p99": 0.9, "P4sim_mixed_tput_80": 1.0, "P4sim_mixed_p99_80": 2 / 3}
    )
    assert figures_of({"mixed": {"points": {"fusefleet-grouped": points["fusefleet-grouped"]}}}, loads) == {}


def test_markdown_has_a_row_per_load_point_and_the_figures() -> None:
    results = {
        "cost_model_ms": {"a": 531.4, "b": 103.5, "ref_side": 512},
        "batch": 8,
        "seconds": 20.0,
        "p4sim": {
            "homog": {
                "capacity": 5.88,
                "split_capacity": 5.88,
                "loads": [0.5, 1.5],
                "rates": [2.94, 8.83],
                "cpu_busy": [0.1, 0.2],
                "points": {
                    "fusefleet-grouped": [_summary(2.9, 1.5), _summary(5.8, 9.0, requests=12)],
                    "bentoml": [_summary(2.9, 1.6), {**_summary(5.7, 9.5, requests=12), "succeeded": 11}],
                },
            }
        },
        "figures": {"P4sim_homog_tput": 1.0175, "P1sim": 0.99},
        "p5": {
            "runs": {"1": {"images_per_s": 5.83}, "2": {"images_per_s": 11.6}},
            "efficiency": {"1": 1.0, "2": 0.995},
            "limit_images_per_s": 5.885,
            "steady_images_per_s": 5.8,
        },
    }
    text = markdown(results)
    assert "| 150% | 8.83 | 5.80 · 0.10 s · 9.00 s | 5.70 · 0.10 s · 9.50 s (1 failed) | 20% |" in text
    assert "| P4sim_homog_tput | 1.018 |" in text
    assert "Images per forward (mean over requests), by load point: fusefleet-grouped ? / ?; bentoml ? / ?." in text
    assert "| throughput / (N x one worker) | 1.000 | 0.995 |" in text
    assert "5.800 / 5.885 img/s = 0.9900 (end to end, first request to last answer: 0.9907)" in text


def test_steady_state_leaves_out_the_first_forward() -> None:
    # a lone first request, then full forwards of 8 with 10 ms gaps (given out of order)
    forwards = [
        {"start": 1.01, "end": 2.01, "images": 8},
        {"start": 0.0, "end": 1.0, "images": 1},
        {"start": 2.02, "end": 3.02, "images": 8},
    ]
    assert steady_images_per_s(forwards) == pytest.approx(16 / 2.02)
    with pytest.raises(ValueError, match="two forwards"):
        steady_images_per_s(forwards[:1])


def test_peer_batches_count_each_pipeline_call() -> None:
    log = (
        "[peer 10:00:00] simulated GPU: CostModel(base_ms=1.0, per_image_ms=1.0, ref_side=512)\n"
        "[peer 10:00:01] litserve batch size=8 groups=[4, 4] took=2.4s\n"
        "INFO: 127.0.0.1 - POST /predict 200\n"
        "[peer 10:00:03] litserve batch size=2 groups=[2] took=0.7s\n"
    )
    got = peer_batches(log)
    assert got["batch_size_histogram"] == {"2": 2, "4": 8}  # requests by the size of the call they ran in
    assert got["mean_batch_size"] == pytest.approx((2 * 2 + 8 * 4) / 10)
    assert got["calls_per_batch"] == 1.5
    assert peer_batches("")["mean_batch_size"] is None


def test_forward_stats_from_a_trace() -> None:
    forwards = [
        {"start": 2.1, "end": 3.0, "images": 8},
        {"start": 0.0, "end": 1.0, "images": 8},
        {"start": 1.05, "end": 2.0, "images": 8},
    ]
    got = forward_stats(forwards)
    assert got["forwards"] == 3
    assert got["forward_gap_ms_p50"] == pytest.approx(75.0)  # gaps of 50 and 100 ms
    assert got["accelerator_busy"] == pytest.approx(2.85 / 3.0)
    assert forward_stats([]) == {"forwards": 0, "forward_gap_ms_p50": None, "accelerator_busy": None}


def test_cpu_busy_counts_idle_and_iowait_as_idle() -> None:
    # user nice system idle iowait irq softirq steal
    assert cpu_busy([0] * 8, [30, 0, 10, 50, 10, 0, 0, 0]) == pytest.approx(0.4)
    assert cpu_busy([5] * 8, [5] * 8) == 0.0


def test_config_refuses_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="start with 1"):
        SimConfig(scale_workers=(2, 4))
    with pytest.raises(ValueError, match="positive"):
        SimConfig(loads=(0.0, 1.0))
    assert SimConfig(cost=CostModel(1.0, 1.0)).loads[-1] > 1.0  # the default sweep reaches past saturation


def test_merge_figures_keeps_the_other_commands_keys(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps({"P1": 0.83, "P5": 0.5}))
    merged = merge_figures(path, {"P5": 0.987654321, "P1sim": 0.99})
    assert merged == {"P1": 0.83, "P5": 0.9877, "P1sim": 0.99}
    assert json.loads(path.read_text()) == merged
