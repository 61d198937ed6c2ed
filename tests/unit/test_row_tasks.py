"""Which tasks a model's step rows carry, as the scheduler reads the announcements (``scheduler.row_tasks``): the
common part over the model's live workers, none for a model nobody announces; and the scheduler's loop keying an
image-to-image request of such a model into a running set opened by a text-to-image one."""

from __future__ import annotations

import time

import fakeredis

from scheduler.row_tasks import RowTasks
from scheduler.store import SchedulerStore
from shared.compat import step_key
from shared.contracts import BatchMessage, ModelCapabilities, ModelTraits, RequestSpec, Task, WorkerCapabilities
from tests.unit.test_scheduler_service import PublishedBatches, running, scheduler, wait_until
from tests.unit.test_scheduler_step_mode import settings_for
from tests.unit.test_scripts import submit

T2I, I2I, INPAINT = Task.TEXT_TO_IMAGE, Task.IMAGE_TO_IMAGE, Task.INPAINT


def served(model: str, *tasks: Task) -> ModelCapabilities:
    return ModelCapabilities(model=model, pipeline="P", tasks=(), traits=ModelTraits(step_tasks=tasks))


def test_a_model_carries_the_tasks_all_its_workers_announce() -> None:
    rows = RowTasks.of(
        {
            "w1": WorkerCapabilities.of((served("a", T2I, I2I, INPAINT), served("b", T2I))),
            "w2": WorkerCapabilities.of((served("a", T2I, I2I),)),
        }
    )
    assert rows.of_model("a") == {T2I, I2I}  # w2 keeps inpainting in its step key: so does the scheduler
    assert rows.of_model("b") == {T2I}
    assert rows.of_model("c") == frozenset()  # nobody announces it: the safe default
    assert rows.of_model(None) == frozenset()  # several models: a request naming none carries nothing


def test_a_fleet_of_one_model_keys_requests_that_name_none_by_it() -> None:
    rows = RowTasks.of({"w": WorkerCapabilities.of((served("demo", T2I, I2I),))})
    assert rows.of_model(None) == {T2I, I2I}
    assert RowTasks().of_model("demo") == frozenset()


def _image_spec(**fields: object) -> RequestSpec:
    base: dict[str, object] = {"id": "x", "model": "demo", "prompt": "x", "seed": 1, "width": 64, "height": 64,
                               "num_inference_steps": 4, "guidance_scale": 5.0, "created_at": 0.0}  # fmt: skip
    return RequestSpec.model_validate(base | fields)


def _scene(announce: bool) -> tuple[fakeredis.FakeRedis, SchedulerStore, PublishedBatches]:
    """Live workers w1 running a set opened by a text-to-image request (its digest as w1 keys it: task and strength
    carried), announcing that its rows carry both tasks when ``announce``, and w2 idle; an image-to-image request
    queued."""
    settings = settings_for(step_mode=True)
    client = fakeredis.FakeRedis(decode_responses=True)
    store = SchedulerStore(client, settings)
    client.zadd(store.keys.workers, dict.fromkeys(("w1", "w2"), time.time() * 1000))  # w2: an idle slot
    if announce:
        client.hset(store.keys.capabilities, "w1", WorkerCapabilities.of((served("demo", T2I, I2I),)).model_dump_json())
    client.hset(store.keys.step_sets, "w1", step_key(_image_spec(), (T2I, I2I)).digest)
    client.hset(store.keys.step_rows, "w1", 1)
    submit(client, store.keys, "i2i", task=I2I, strength=0.6)
    return client, store, PublishedBatches()


def test_an_image_to_image_request_joins_a_text_to_image_set_of_a_model_whose_rows_carry_both() -> None:
    client, store, celery = _scene(announce=True)
    with running(scheduler(client, settings_for(step_mode=True), celery)):
        assert wait_until(lambda: client.llen(store.keys.step_inbox("w1")) == 1, 5)
    [message] = [BatchMessage.model_validate_json(m) for m in client.lrange(store.keys.step_inbox("w1"), 0, -1)]
    assert message.request_ids == ("i2i",)
    assert celery.batches == []


def test_without_an_announcement_the_task_stays_in_the_key_and_the_request_starts_its_own_set() -> None:
    client, store, celery = _scene(announce=False)
    with running(scheduler(client, settings_for(step_mode=True), celery)):
        assert wait_until(lambda: len(celery.batches) == 1, 5)
    assert not client.exists(store.keys.step_inbox("w1"))
    assert [batch["request_ids"] for batch in celery.batches] == [["i2i"]]
