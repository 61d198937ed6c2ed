"""The simulated GPU of the GPU-shaped benchmark: one cost model, one output, the same in fusefleet and the peers."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from bench.peers import peer_common
from bench.peers.simulated_gpu import (
    BASE_ENV,
    PER_IMAGE_ENV,
    REF_SIDE_ENV,
    REF_STEPS_ENV,
    TRACE_ENV,
    CostModel,
    placeholder_image,
    sleep_forward,
)
from bench.runners import SimulatedGpuRunner, SimulatedGpuSettings
from gpu_worker.images import encode
from shared.contracts import RequestSpec
from shared.settings import Settings

PEERS_DIR = Path(peer_common.__file__).resolve().parent


def _spec(side: int, n: int = 1, steps: int = 4) -> RequestSpec:
    return RequestSpec(
        id=f"r{side}", model="demo", prompt="p", seed=1, width=side, height=side, n=n, num_inference_steps=steps,
        guidance_scale=7.5, created_at=0.0,
    )  # fmt: skip


def test_fit_recovers_a_linear_curve() -> None:
    exact = {batch: 0.25 + 0.05 * batch for batch in (1, 2, 4, 8)}
    assert CostModel.fit(exact, ref_side=512) == CostModel(250.0, 50.0, 512)
    with pytest.raises(ValueError, match="two batch sizes"):
        CostModel.fit({4: 1.0})


def test_cost_weighs_each_image_by_its_area() -> None:
    cost = CostModel(100.0, 20.0, ref_side=512)
    assert cost.units(768, 768) == pytest.approx(2.25)
    assert cost.forward_s([(512, 512), (768, 768)]) == pytest.approx((100 + 20 * 3.25) / 1000)
    assert CostModel(100.0, 20.0).forward_s([(64, 64), (1024, 1024)]) == pytest.approx(0.14)  # no ref side: flat
    # full single-size batches: 4 images per t(4), and the mix is the harmonic mean of its sizes' rates
    assert cost.capacity([512], 4) == pytest.approx(4 / 0.18)
    assert cost.capacity([512, 768], 4) == pytest.approx(8 / (0.18 + 0.28))
    # a batch of 4 alternating sizes split in two calls of 2: a is paid twice
    assert cost.split_capacity([512, 768], 4) == pytest.approx(4 / (cost.forward_s([(512, 512)] * 2) + 0.19))
    assert cost.split_capacity([512], 4) == pytest.approx(cost.capacity([512], 4))


def test_environment_round_trip_and_missing_variables() -> None:
    cost = CostModel(531.4, 103.5, 512)
    assert CostModel.from_env(cost.env()) == cost
    assert CostModel.from_env({BASE_ENV: "10", PER_IMAGE_ENV: "2"}) == CostModel(10.0, 2.0, 0)
    with pytest.raises(KeyError, match=PER_IMAGE_ENV):
        CostModel.from_env({BASE_ENV: "10"})


def test_sleep_forward_takes_its_time_and_stops_when_asked() -> None:
    seen: list[int] = []
    started = time.monotonic()
    assert sleep_forward(0.1, 5, lambda step, total: seen.append(step) or False) is False
    assert 0.1 <= time.monotonic() - started < 0.5
    assert seen == [1, 2, 3, 4, 5]
    started = time.monotonic()
    assert sleep_forward(1.0, 10, lambda step, total: step == 2) is True
    assert time.monotonic() - started < 0.5


def test_fusefleet_runner_uses_the_shared_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REF_SIDE_ENV, "512")
    runner = SimulatedGpuRunner(Settings(), SimulatedGpuSettings(sim_base_ms=30.0, sim_per_image_ms=10.0))
    assert runner.cost == CostModel(30.0, 10.0, 512)
    assert runner.cost_s(3) == pytest.approx(0.06)  # images of the reference size (tests/support's ChaosRunner)
    steps: list[int] = []
    started = time.monotonic()
    images = runner.run([_spec(512, n=2), _spec(768)], lambda step, total: steps.append(step) or False)
    took = time.monotonic() - started
    assert took >= (30 + 10 * (2 + 2.25)) / 1000
    assert steps == [1, 2, 3, 4]
    assert [len(outputs) for outputs in images] == [2, 1]
    assert images[1][0].tobytes() == placeholder_image(768, 768).tobytes()


def test_fusefleet_runner_reads_what_the_benchmark_sets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A worker builds the runner from the fleet's settings alone: the cost model comes from the variables
    ``CostModel.env`` writes (the benchmark's, which the fleet's settings do not know)."""
    cost = CostModel(60.0, 5.0, 512, ref_steps=20)
    for name, value in {**cost.env(), TRACE_ENV: str(tmp_path / "trace")}.items():
        monkeypatch.setenv(name, value)
    runner = SimulatedGpuRunner(Settings())
    assert runner.cost == cost and runner.trace == str(tmp_path / "trace")
    monkeypatch.setenv(REF_SIDE_ENV, "")
    monkeypatch.setenv(REF_STEPS_ENV, "")
    monkeypatch.delenv(TRACE_ENV)
    assert SimulatedGpuSettings().cost == CostModel(60.0, 5.0) and SimulatedGpuRunner(Settings()).trace is None
    assert not [field for field in Settings.model_fields if field.startswith("sim_")]


def test_every_server_encodes_the_same_png() -> None:
    image = placeholder_image(512, 512)
    assert image.size == (8, 8)
    assert peer_common.to_png(image) == encode(image)  # the peers' encoder and the fusefleet worker's


def test_peer_forward_pays_the_base_cost_once_per_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer splits a mixed batch into one call per size (diffusers cannot mix sizes in one call), each paying a."""
    cost = CostModel(60.0, 5.0, 512)
    for name, value in {"BENCH_RUNNER": "simulated", **cost.env()}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(PEERS_DIR))  # the peers import simulated_gpu from their working directory
    monkeypatch.delitem(sys.modules, "simulated_gpu", raising=False)
    forward = peer_common.load_forward()
    reqs = [peer_common.normalize_request({"prompt": "p", "width": side, "height": side}) for side in (512, 768) * 2]
    started = time.monotonic()
    pngs = peer_common.run_batch(forward, reqs, "test")
    took = time.monotonic() - started
    assert took >= cost.forward_s([(512, 512)] * 2) + cost.forward_s([(768, 768)] * 2)
    assert pngs == [encode(placeholder_image(512, 512))] * 4


def test_peer_refuses_an_unknown_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_RUNNER", "tpu")
    with pytest.raises(ValueError, match="BENCH_RUNNER"):
        peer_common.load_forward()
