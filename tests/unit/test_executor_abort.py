"""Request-level abort (issue 12): a request aborted while its fused forward runs ends ``aborted`` at once, its
outputs are never stored, and its peers finish as if nothing happened.

The executor runs the real diffusers runner on the tiny demo model, on fakeredis with the real Lua scripts;
``StepHooks`` runs a test's actions on the denoising loop's thread before the forward reports a given step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import fakeredis
import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("diffusers")

from gpu_worker.diffusers_runner import DiffusersRunner  # noqa: E402
from gpu_worker.executor import BatchExecutor, BatchOutcome  # noqa: E402
from gpu_worker.runner import Runner, StepCallback  # noqa: E402
from gpu_worker.store import WorkerStore  # noqa: E402
from shared import keys as k  # noqa: E402
from shared.contracts import BatchMessage, ModelTraits, RequestSpec  # noqa: E402
from shared.results.filesystem import FilesystemResultStore  # noqa: E402
from shared.settings import Settings  # noqa: E402
from tests.support.processes import wait_for  # noqa: E402
from tests.support.solo import png_array  # noqa: E402
from tests.unit.test_executor import scheduled_batch  # noqa: E402

STEPS = 10
IDS = ["peer-a", "victim", "peer-b"]
TERMINAL = {"succeeded", "failed", "aborted"}


# ``runner`` (the real runner on the demo model, on one torch thread) and ``client``: tests/unit/conftest.py


@pytest.fixture
def settings() -> Settings:
    return Settings(key_prefix="t", batch_lock_ttl_s=5, result_ttl_s=60)


@pytest.fixture
def results(tmp_path: Path) -> FilesystemResultStore:
    return FilesystemResultStore(tmp_path / "results")


class StepHooks(Runner):
    """The real runner (one fused forward per batch) that runs ``hooks[k]`` before reporting step ``k`` (each hook
    once), and raises at step ``raise_at`` when set (a pipeline failing mid-forward)."""

    fused = True

    def __init__(self, inner: DiffusersRunner, hooks: dict[int, Callable[[], None]], raise_at: int = 0) -> None:
        self.inner = inner
        self.hooks = hooks
        self.raise_at = raise_at
        self.forwards: list[list[str]] = []

    @property
    def traits(self) -> ModelTraits:
        return self.inner.traits

    def run(self, specs: Sequence[RequestSpec], on_step: StepCallback) -> list[list[Image.Image]]:
        self.forwards.append([spec.id for spec in specs])
        fails = self.raise_at if len(specs) > 1 else 0

        def step(index: int, total: int) -> bool:
            hook = self.hooks.pop(index, None)
            if hook is not None:
                hook()
            if index == fails:
                raise ValueError("the fused forward broke")
            return on_step(index, total)

        return self.inner.run(specs, step)


def batch_of_ten_steps(client: fakeredis.FakeRedis, settings: Settings) -> tuple[WorkerStore, BatchMessage]:
    """Batch B1 of ``IDS`` (32 px, ``STEPS`` steps, a seed each) as the scheduler publishes it; the worker's store."""
    store = WorkerStore(client, settings)
    batch = scheduled_batch(client, settings, IDS)
    for seed, rid in enumerate(IDS):
        spec = RequestSpec.model_validate_json(str(client.hget(store.keys.request(rid), "spec")))
        update = {"num_inference_steps": STEPS, "width": 32, "height": 32, "seed": 10 + seed}
        client.hset(store.keys.request(rid), "spec", spec.model_copy(update=update).model_dump_json())
    return store, batch


def status(client: fakeredis.FakeRedis, store: WorkerStore, rid: str) -> str:
    return str(client.hget(store.keys.request(rid), "status"))


def events(client: fakeredis.FakeRedis, store: WorkerStore, rid: str) -> list[str]:
    return [fields["event"] for _, fields in client.xrange(store.keys.request(rid) + ":events")]


def execute(
    client: fakeredis.FakeRedis, settings: Settings, hooked: StepHooks, results: FilesystemResultStore
) -> BatchOutcome:
    store, batch = batch_of_ten_steps(client, settings)
    outcome = BatchExecutor(store, hooked, "w1", None, results).execute(batch)  # type: ignore[arg-type]
    assert isinstance(outcome, BatchOutcome)
    return outcome


def stored_image(
    client: fakeredis.FakeRedis, store: WorkerStore, results: FilesystemResultStore, rid: str
) -> np.ndarray:
    (key,) = str(client.hget(store.keys.request(rid), "results")).split()
    data = results.get(key)
    assert data is not None
    return png_array(data)


def reference_images(settings: Settings, runner: DiffusersRunner, tmp_path: Path) -> dict[str, np.ndarray]:
    """Each request's stored image when the same batch runs on a Redis of its own with nothing aborted (all
    succeed)."""
    client = fakeredis.FakeRedis(decode_responses=True)
    results = FilesystemResultStore(tmp_path / "reference")
    reference = execute(client, settings, StepHooks(runner, {}), results)
    assert set(reference.statuses.values()) == {"succeeded"}
    store = WorkerStore(client, settings)
    return {rid: stored_image(client, store, results, rid) for rid in IDS}


def abort(client: fakeredis.FakeRedis, store: WorkerStore, rid: str) -> None:
    script = client.register_script(k.ABORT)
    assert script(keys=k.abort_keys(store.keys, rid), args=[time.time(), 60, store.keys.finished, rid]) == "running"


def test_an_aborted_request_ends_at_once_and_its_peers_finish_unchanged(
    client: fakeredis.FakeRedis,
    settings: Settings,
    runner: DiffusersRunner,
    results: FilesystemResultStore,
    tmp_path: Path,
) -> None:
    expected = reference_images(settings, runner, tmp_path)

    store = WorkerStore(client, settings)
    finished = client.pubsub(ignore_subscribe_messages=True)
    finished.subscribe(store.keys.finished)  # what the api's long polls wait on
    seen: dict[str, object] = {}

    def while_running() -> None:  # step 5 of 10, on the denoising loop's thread
        wait_for(lambda: status(client, store, "victim") == "aborted", 10, "the victim to end at once")
        seen["events"] = events(client, store, "victim")
        seen["peers"] = [status(client, store, rid) for rid in ("peer-a", "peer-b")]
        message = wait_for(lambda: finished.get_message(timeout=0.05), 5, "the long polls to be woken")
        seen["woken"] = message["data"] if isinstance(message, dict) else None

    hooked = StepHooks(runner, {2: lambda: abort(client, store, "victim"), 5: while_running})
    outcome = execute(client, settings, hooked, results)

    assert isinstance(seen["events"], list) and seen["events"][-1] == "aborted"  # its terminal event, at once
    assert seen["peers"] == ["running", "running"]
    assert seen["woken"] == "victim"
    assert hooked.forwards == [IDS]  # one fused forward, run to its end for the peers
    assert outcome.statuses == {"peer-a": "succeeded", "victim": "aborted", "peer-b": "succeeded"}
    for rid in ("peer-a", "peer-b"):
        assert np.array_equal(stored_image(client, store, results, rid), expected[rid]), f"{rid} changed"
        assert client.hget(store.keys.request(rid), "step") == str(STEPS)
    victim = client.hgetall(store.keys.request("victim"))
    assert "images" not in victim and "results" not in victim and "error_type" not in victim
    # nothing of the victim's is stored, and the keys journaled for it are due at once (the sweeper forgets them)
    journaled = dict(client.zrange(store.keys.results_journal, 0, -1, withscores=True))
    victim_keys = [key for key in journaled if key.startswith("victim/")]
    assert victim_keys and all(journaled[key] <= time.time() * 1000 for key in victim_keys)
    assert not list(results.root.glob("victim*")) and all(results.get(key) is None for key in victim_keys)
    assert len(list(results.root.rglob("*.png"))) == 2  # the peers' images only
    for rid in IDS:
        assert sum(event in TERMINAL for event in events(client, store, rid)) == 1, events(client, store, rid)
    assert client.zrange(store.keys.inflight, 0, -1) == []


def test_a_request_aborted_in_a_forward_that_then_fails_is_not_run_again(
    client: fakeredis.FakeRedis, settings: Settings, runner: DiffusersRunner, results: FilesystemResultStore
) -> None:
    store = WorkerStore(client, settings)
    hooked = StepHooks(runner, {2: lambda: abort(client, store, "victim")}, raise_at=5)
    ended_at_once: list[bool] = []
    hooked.hooks[4] = lambda: ended_at_once.append(
        bool(wait_for(lambda: status(client, store, "victim") == "aborted", 10, "the abort"))
    )
    outcome = execute(client, settings, hooked, results)
    assert ended_at_once == [True]  # ended while the fused forward ran, before it broke at step 5
    assert hooked.forwards == [IDS, ["peer-a"], ["peer-b"]]  # the peers one by one; the victim not again
    assert outcome.statuses == {"peer-a": "succeeded", "victim": "aborted", "peer-b": "succeeded"}
    for rid in IDS:
        assert sum(event in TERMINAL for event in events(client, store, rid)) == 1


def test_a_family_with_a_step_adapter_drops_the_aborted_rows_at_the_next_step(
    client: fakeredis.FakeRedis,
    settings: Settings,
    runner: DiffusersRunner,
    results: FilesystemResultStore,
    tmp_path: Path,
) -> None:
    assert runner.fused_by_steps  # the demo model's family (Stable Diffusion) runs request-level batches by steps
    expected = reference_images(settings, runner, tmp_path)  # the pipeline call

    store, batch = batch_of_ten_steps(client, settings)
    unet_batches: list[int] = []

    def count(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        unet_batches.append(int(args[0].shape[0]))
        if len(unet_batches) == 2:
            abort(client, store, "victim")
        if len(unet_batches) == 3:  # the reporter writes every 250 ms: the tiny forward waits for it to see the abort
            wait_for(lambda: status(client, store, "victim") == "aborted", 10, "the reporter to end the victim")

    handle = runner.pipe.unet.register_forward_pre_hook(count)
    try:
        outcome = BatchExecutor(store, runner, "w1", None, results).execute(batch)
    finally:
        handle.remove()
    assert isinstance(outcome, BatchOutcome)
    assert outcome.statuses == {"peer-a": "succeeded", "victim": "aborted", "peer-b": "succeeded"}
    # 3 guided rows: 6 UNet rows a step; once the abort is back from Redis, the victim's two halves are gone
    assert unet_batches[:2] == [6, 6] and unet_batches[-1] == 4 and len(unet_batches) == STEPS, unet_batches
    assert set(unet_batches) == {6, 4} and unet_batches == sorted(unet_batches, reverse=True)
    for rid in ("peer-a", "peer-b"):  # the step engine's tolerance against the pipeline call: 1/255
        got = stored_image(client, store, results, rid)  # int16: the difference may be negative
        assert np.abs(got - expected[rid]).max() <= 1, rid
    assert not list(results.root.glob("victim*"))
    for rid in IDS:
        assert sum(event in TERMINAL for event in events(client, store, rid)) == 1
