"""The simulated GPU's per-step cost and its running sets (``bench.runners.SimulatedStepSet``, step mode): steps,
joins between steps, aborts, and what a step costs for its rows. Nothing here is timed: the sets are given a
``sleep`` that records the seconds it is asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.peers.simulated_gpu import REF_STEPS, REF_STEPS_ENV, CostModel
from bench.runners import SimulatedGpuRunner, SimulatedGpuSettings, SimulatedStepSet
from gpu_worker.runner import Runner, StepSet
from shared.compat import step_key
from shared.contracts import RequestSpec, Task
from shared.settings import Settings

COST = CostModel(500.0, 100.0, ref_side=512)


def _spec(rid: str, steps: int, n: int = 1, side: int = 512, guidance: float = 7.5, **extra: object) -> RequestSpec:
    return RequestSpec(
        id=rid, model="demo", prompt=rid, seed=1, width=side, height=side, n=n, num_inference_steps=steps,
        guidance_scale=guidance, created_at=0.0, **extra,
    )  # fmt: skip


def _unchecked(rid: str, **fields: object) -> RequestSpec:
    """A spec past the bounds every stored spec keeps (``SamplingParams``), built without validation: what a set
    must refuse all the same."""
    return RequestSpec.model_construct(**{**dict(_spec(rid, 2)), **fields})


def _simulated(base_ms: float, per_image_ms: float) -> SimulatedGpuSettings:
    """The simulated GPU's settings with these a and b, the rest from the environment."""
    return SimulatedGpuSettings(sim_base_ms=base_ms, sim_per_image_ms=per_image_ms)


class _Clock:
    """What a set is asked to sleep, step by step (in place of ``time.sleep``)."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)


def _set(clock: _Clock, cost: CostModel = COST, trace: str | None = None) -> SimulatedStepSet:
    return SimulatedStepSet(cost, step_key(_spec("key", 20)), trace, sleep=clock)


def test_the_per_step_form_of_the_cost_model() -> None:
    sizes = [(512, 512)] * 4
    assert COST.step_s(sizes) == pytest.approx((500 + 100 * 4) / 1000 / REF_STEPS)
    assert COST.step_s([(768, 768)]) == pytest.approx((500 + 100 * 2.25) / 1000 / REF_STEPS)
    assert COST.step_s([]) == 0.0
    # without ref_steps a forward costs t(B) whatever its steps (the test fleets' model)
    assert COST.forward_s(sizes, steps=10) == COST.forward_s(sizes) == pytest.approx(0.9)
    per_step = CostModel(500.0, 100.0, 512, ref_steps=20)
    assert per_step.forward_s(sizes, steps=10) == pytest.approx(0.45)
    assert per_step.forward_s(sizes, steps=40) == pytest.approx(1.8)
    # at the reference step count nothing changes, and the peers (no steps given) pay the same
    assert per_step.forward_s(sizes, steps=20) == per_step.forward_s(sizes) == COST.forward_s(sizes)
    # a request-level forward of S steps costs S steps of a running set of the same rows
    assert per_step.forward_s(sizes, steps=15) == pytest.approx(15 * per_step.step_s(sizes))
    assert CostModel(500.0, 100.0, 512, ref_steps=10).step_s(sizes) == pytest.approx(0.09)
    assert CostModel.from_env(per_step.env()) == per_step


def test_the_runner_scales_a_forward_by_its_steps_only_with_ref_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[float, int]] = []
    monkeypatch.delenv(REF_STEPS_ENV, raising=False)
    monkeypatch.setattr("bench.runners.sleep_forward", lambda seconds, steps, on_step: asked.append((seconds, steps)))
    settings = Settings()
    SimulatedGpuRunner(settings, _simulated(500.0, 100.0)).run([_spec("a", 10, n=2)], lambda step, total: False)
    monkeypatch.setenv(REF_STEPS_ENV, "20")
    scaled = SimulatedGpuRunner(settings, _simulated(500.0, 100.0))
    assert scaled.cost.ref_steps == 20
    scaled.run([_spec("b", 10, n=2)], lambda step, total: False)
    scaled.run([_spec("c", 20, n=2)], lambda step, total: False)
    assert [seconds for seconds, _ in asked] == pytest.approx([0.7, 0.35, 0.7])
    assert [steps for _, steps in asked] == [10, 10, 20]


def test_the_runner_runs_step_mode_for_what_the_engine_takes() -> None:
    runner = SimulatedGpuRunner(Settings(), _simulated(0.0, 0.0))
    assert isinstance(runner, Runner) and runner.step_mode
    running = runner.step_set(step_key(_spec("a", 4)))
    assert isinstance(running, SimulatedStepSet)
    protocol: StepSet = running  # the worker's contract (mypy checks it)
    assert protocol.requests == ()
    with pytest.raises(ValueError, match="task"):
        runner.step_set(step_key(_spec("inpaint", 4, task=Task.INPAINT, strength=0.5)))
    carried = runner.traits.step_tasks  # its rows carry task and strength, as Stable Diffusion's do
    assert set(carried) == {Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE}
    image = runner.step_set(step_key(_spec("i2i", 4, task=Task.IMAGE_TO_IMAGE, strength=0.5), carried))
    mixed = [
        _spec("i2i", 4, task=Task.IMAGE_TO_IMAGE, strength=0.5),
        _spec("i2i-b", 4, task=Task.IMAGE_TO_IMAGE, strength=0.75),
        _spec("t2i", 4),
    ]
    assert image.join(mixed) == {}  # one set: the worker keys them as the runner announces
    # image-to-image starts int(4 * strength) steps before the end
    assert image.progress() == {"i2i": (0, 2), "i2i-b": (0, 3), "t2i": (0, 4)}
    refused = image.join([_spec("inpaint", 4, task=Task.INPAINT, strength=0.5)])
    assert list(refused) == ["inpaint"]  # a task its rows do not carry keeps its own key
    with pytest.raises(ValueError, match="num_frames"):
        runner.step_set(step_key(_spec("video", 4, num_frames=9)))


def test_each_request_takes_its_own_steps_and_leaves_when_done() -> None:
    clock = _Clock()
    running = _set(clock)
    assert running.join([_spec("two", 2, n=2), _spec("three", 3, guidance=1.0)]) == {}
    assert running.requests == ("two", "three")
    assert running.progress() == {"two": (0, 2), "three": (0, 3)}
    assert running.step() == []
    assert running.progress() == {"two": (1, 2), "three": (1, 3)}
    assert running.step() == ["two"]
    assert list(running.requests) == ["three"] and running.progress() == {"three": (2, 3)}
    (images,) = running.outputs(["two"])
    assert len(images) == 2 and images[0].size == (8, 8)
    with pytest.raises(KeyError, match="two"):
        running.outputs(["two"])  # taken once
    assert running.step() == ["three"]
    assert [len(images) for images in running.outputs(["three"])] == [1]
    assert not running.requests and running.step() == []
    assert len(clock.slept) == 3  # an empty set does not sleep


def test_a_request_joins_between_steps_and_finishes_on_its_own_count() -> None:
    clock = _Clock()
    running = _set(clock)
    running.join([_spec("long", 3)])
    assert running.step() == []
    running.join([_spec("late", 2, guidance=5.0)])
    assert running.progress() == {"long": (1, 3), "late": (0, 2)}
    assert running.step() == []
    assert running.step() == ["long", "late"]  # the same step ends both, reported in joining order
    assert len(running.outputs(["late", "long"])) == 2


def test_refused_joins_add_nothing() -> None:
    running = _set(_Clock())
    running.join([_spec("a", 2)])
    refused = running.join(
        [
            _spec("a", 2),
            _spec("small", 2, side=256),
            _unchecked("zero", num_inference_steps=0),
            _unchecked("rescale", guidance_rescale=1.5),
            _spec("ok", 5),
        ]
    )
    assert set(refused) == {"a", "small", "zero", "rescale"}
    assert "already" in refused["a"] and "step key" in refused["small"]
    assert "num_inference_steps" in refused["zero"] and "guidance_rescale" in refused["rescale"]
    assert running.requests == ("a", "ok")


def test_an_aborted_request_leaves_before_the_next_step() -> None:
    clock = _Clock()
    running = _set(clock)
    running.join([_spec("victim", 5, n=3), _spec("peer", 2)])
    running.step()
    assert running.abort("victim") is True
    assert running.abort("victim") is False and running.abort("unknown") is False
    assert running.progress() == {"peer": (1, 2)}
    assert running.step_cost_s() == pytest.approx(COST.step_s([(512, 512)]))  # the victim's rows are gone
    assert running.step() == ["peer"]
    assert clock.slept[-1] == pytest.approx((500 + 100) / 1000 / REF_STEPS)


def test_a_request_aborted_while_a_step_runs_is_never_returned() -> None:
    running: SimulatedStepSet

    def abort_midway(seconds: float) -> None:  # another thread's abort, while the step sleeps
        running.abort("victim")

    running = SimulatedStepSet(COST, step_key(_spec("key", 1)), sleep=abort_midway)
    running.join([_spec("victim", 1), _spec("peer", 1)])
    assert running.step() == ["peer"]
    with pytest.raises(KeyError, match="victim"):
        running.outputs(["victim"])


def test_a_step_costs_a_plus_b_per_row_over_twenty() -> None:
    clock = _Clock()
    running = _set(clock)
    running.join([_spec("one", 4)])
    running.step()
    running.join([_spec("four", 4, n=4), _spec("three", 4, n=3)])
    assert running.step_cost_s() == pytest.approx((500 + 100 * 8) / 1000 / 20)
    assert running.step_cost_s(only=["three"]) == pytest.approx((500 + 100 * 3) / 1000 / 20)
    running.step()
    assert running.step(only=["three"]) == []
    assert clock.slept == pytest.approx([0.03, 0.065, 0.04])
    assert running.progress() == {"one": (2, 4), "four": (1, 4), "three": (2, 4)}
    wide = _set(clock, CostModel(500.0, 100.0, 512, ref_steps=10))
    wide.join([_spec("big", 1, n=2)])
    wide.step()
    assert clock.slept[-1] == pytest.approx(0.07)  # a and b of a 10-step forward: a tenth of it per step


def test_steps_are_traced_when_asked(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    running = _set(_Clock(), trace=str(trace))
    running.join([_spec("a", 1, n=2), _spec("b", 2)])
    running.step()
    running.step()
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(line["rows"], line["finished"]) for line in lines] == [(3, 2), (1, 1)]
    assert all(line["end"] >= line["start"] for line in lines)
