"""The bounds on encoded outputs (``gpu_worker.output_bounds``): pure, then through a real ``BatchExecutor`` on
fakeredis (its result writer), where a request over a bound fails alone with ``OutputTooLarge`` and nothing of it
is stored, its peers stored as always."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest

from gpu_worker.executor import BatchOutcome
from gpu_worker.images import encode
from gpu_worker.output_bounds import OUTPUT_TOO_LARGE, OutputBounds
from shared.results.filesystem import FilesystemResultStore
from shared.settings import Settings
from tests.unit import test_executor
from tests.unit.test_executor import ScriptedRunner, error, executor, image, scheduled_batch


@pytest.fixture
def settings() -> Settings:
    return Settings(key_prefix="t", max_batch_attempts=3, batch_lock_ttl_s=5, result_ttl_s=60)


@pytest.fixture(autouse=True)
def result_store(tmp_path: Path) -> Iterator[FilesystemResultStore]:
    """The result store test_executor's ``executor`` builds with: a folder of the test's ``tmp_path``."""
    test_executor._RESULTS["store"] = FilesystemResultStore(tmp_path / "results")
    yield test_executor._RESULTS["store"]
    test_executor._RESULTS.clear()


def test_a_request_over_its_own_bound_is_refused_and_not_counted() -> None:
    budget = OutputBounds(per_request=100, per_batch=250).budget()
    assert budget.take(100) is None  # at the bound: fits
    assert "max_request_output_bytes is 100" in (budget.take(101) or "")
    assert budget.take(100) is None and budget.stored == 200  # the refused one took nothing
    assert "max_batch_output_bytes is 250" in (budget.take(51) or "")
    assert budget.take(50) is None and budget.stored == 250


def test_no_bounds_take_everything() -> None:
    budget = OutputBounds().budget()
    assert budget.take(10**12) is None and budget.take(10**12) is None


def run(client: fakeredis.FakeRedis, settings: Settings, prompts: list[str], bounds: OutputBounds) -> BatchOutcome:
    worker = executor(client, settings, ScriptedRunner())
    worker.writer.bounds = bounds
    outcome = worker.execute(scheduled_batch(client, settings, prompts))
    assert isinstance(outcome, BatchOutcome)
    return outcome


def stored_files(folder: Path) -> int:
    return sum(1 for path in folder.rglob("*") if path.is_file())


def test_the_request_that_takes_its_batch_past_the_bound_fails_alone(
    client: fakeredis.FakeRedis, settings: Settings, tmp_path: Path
) -> None:
    one = len(encode(image()))  # every output of the scripted runner: one 8x8 PNG
    outcome = run(client, settings, ["a", "b", "c"], OutputBounds(per_request=one, per_batch=2 * one))
    assert outcome.statuses == {"a": "succeeded", "b": "succeeded", "c": "failed"}
    kind, message = error(client, settings, "c")
    assert kind == OUTPUT_TOO_LARGE and f"max_batch_output_bytes is {2 * one}" in message
    assert stored_files(tmp_path / "results") == 2  # nothing of c was stored


def test_a_request_over_its_own_bound_fails_alone(client: fakeredis.FakeRedis, settings: Settings) -> None:
    one = len(encode(image()))
    outcome = run(client, settings, ["a", "b"], OutputBounds(per_request=one - 1))
    assert set(outcome.statuses.values()) == {"failed"}
    kind, message = error(client, settings, "a")
    assert kind == OUTPUT_TOO_LARGE and f"encode to {one} bytes" in message
    client.flushall()
    outcome_ok = run(client, settings, ["c"], OutputBounds(per_request=one))
    assert outcome_ok.statuses == {"c": "succeeded"}
