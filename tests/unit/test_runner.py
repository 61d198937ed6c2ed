"""The runner contract (``gpu_worker.runner.Runner``): what a runner that declares only ``fused`` and ``run`` gets,
and what ``load_runner`` accepts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from PIL import Image

from gpu_worker.runner import TEXT_ONLY, Runner, StepCallback, load_runner
from shared.compat import step_key
from shared.contracts import ModelTraits, RequestSpec
from shared.settings import Settings
from tests.support.specs import demo_spec


class Minimal(Runner):
    """Declares what a runner must, nothing else."""

    fused = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def run(
        self, specs: Sequence[RequestSpec], on_step: StepCallback, inputs: object = None
    ) -> list[list[Image.Image]]:
        return [[Image.new("RGB", (8, 8))] * spec.n for spec in specs]


class NotARunner:
    """Has the hooks' shape but does not subclass ``Runner``."""

    fused = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def run(self, specs: Sequence[RequestSpec], on_step: StepCallback) -> list[list[Image.Image]]:
        return []


def test_a_runner_that_declares_only_fused_and_run_gets_every_default() -> None:
    runner = Minimal(Settings())
    assert runner.traits == ModelTraits(family="Minimal", fused=True)
    assert runner.tasks == TEXT_ONLY
    assert runner.pipeline_name == "Minimal"
    assert not runner.step_mode and not runner.fused_by_steps
    runner.release_memory()  # nothing to give back
    with pytest.raises(ValueError, match="Minimal does not run step mode"):
        runner.step_set(step_key(demo_spec("a", 4, side=32)))


def test_a_runner_without_fused_or_run_cannot_be_made() -> None:
    class NoRun(Runner):
        fused = False

    with pytest.raises(TypeError, match="run"):
        NoRun()  # type: ignore[abstract]


def test_load_runner_constructs_the_import_path_with_the_settings() -> None:
    settings = Settings(runner=f"{__name__}:Minimal")
    runner = load_runner(settings)
    assert isinstance(runner, Minimal) and runner.settings is settings
    assert isinstance(load_runner(Settings(runner=f"{__name__}.Minimal")), Minimal)


def test_load_runner_refuses_what_is_not_a_runner() -> None:
    with pytest.raises(TypeError, match="NotARunner is not a gpu_worker.runner.Runner"):
        load_runner(Settings(runner=f"{__name__}:NotARunner"))
    with pytest.raises(ValueError, match="FUSEFLEET_RUNNER must look like"):
        load_runner(Settings(runner="nomodule"))
