"""Log lines (shared/logging_setup.py, gpu_worker/log_context.py): JSON lines parse and carry the request, batch and
worker they concern, from the call's ``extra``, the bound context, or the process; text lines name them too."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery.signals import celeryd_init, setup_logging, task_postrun, task_prerun

from gpu_worker.log_context import CeleryTaskIds, install_worker_logging
from shared import logging_setup
from shared.logging_setup import carry_context, configure_logging, ids, log_context

log = logging.getLogger("fusefleet.test")


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """The root logger writes here for the test; its handlers, level and the process ids are restored after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    process = dict(logging_setup._process)
    out = io.StringIO()
    yield out
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging_setup._process.clear()
    logging_setup._process.update(process)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_the_ids_from_the_call_the_context_and_the_process(stream: io.StringIO) -> None:
    configure_logging("info", "json", service="worker", worker="gpu0@host", stream=stream)
    log.info("starting")
    with log_context(batch_id="B1"):
        log.info("batch %s running", "B1")
        with log_context(request_id="r1"):
            log.warning("request failed")
        log.info("one of many", extra=ids(request_id="r2"))
    log.debug("not at this level")
    log.info("published", extra=ids(batch_id="B2", request_ids=["r3", "r4"]))
    first, running, failed, other, published = lines(stream)
    assert set(first) == {"time", "level", "logger", "message", "service", "worker"}
    assert first["level"] == "INFO" and first["logger"] == "fusefleet.test" and first["message"] == "starting"
    assert first["time"].endswith("+00:00") and first["service"] == "worker" and first["worker"] == "gpu0@host"
    assert running["batch_id"] == "B1" and running["message"] == "batch B1 running" and "request_id" not in running
    assert (failed["batch_id"], failed["request_id"], failed["level"]) == ("B1", "r1", "WARNING")
    assert (other["batch_id"], other["request_id"]) == ("B1", "r2")
    assert published["batch_id"] == "B2" and published["request_ids"] == ["r3", "r4"]


def test_an_exception_stays_on_its_line(stream: io.StringIO) -> None:
    configure_logging("info", "json", stream=stream)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it failed", extra=ids(request_id="r1"))
    (line,) = lines(stream)
    assert line["request_id"] == "r1" and "ValueError: boom" in line["exception"]


def test_a_thread_keeps_the_ids_only_when_handed_them(stream: io.StringIO) -> None:
    configure_logging("info", "json", worker="gpu0@host", stream=stream)
    with log_context(batch_id="B1"):
        carried = threading.Thread(target=carry_context(lambda: log.info("carried")))
        bare = threading.Thread(target=lambda: log.info("bare"))
    for thread in (carried, bare):
        thread.start()
        thread.join()
    by_message = {line["message"]: line for line in lines(stream)}
    assert by_message["carried"]["batch_id"] == "B1"
    assert "batch_id" not in by_message["bare"] and by_message["bare"]["worker"] == "gpu0@host"


def test_text_lines_name_the_ids_after_the_message(stream: io.StringIO) -> None:
    configure_logging("info", "text", service="scheduler", stream=stream)
    log.info("published batch B1", extra=ids(batch_id="B1", request_ids=["r1", "r2"]))
    log.info("plain")
    first, second = stream.getvalue().splitlines()
    assert first.endswith("INFO fusefleet.test: published batch B1 [batch_id=B1 request_ids=r1,r2]")
    assert second.endswith("INFO fusefleet.test: plain")


def test_celery_hooks_name_the_worker_and_each_tasks_batch(stream: io.StringIO) -> None:
    uninstall = install_worker_logging("info", "json")
    try:
        configure_logging("info", "json", stream=stream)  # as the hook leaves it, into this test's stream
        worker = SimpleNamespace(quiet=False)
        celeryd_init.send(sender="gpu0@host", instance=worker, conf=None, options={})
        assert worker.quiet  # no banner on stdout among JSON lines
        assert setup_logging.send(sender=None, loglevel=20, logfile=None, format="", colorize=False)  # Celery's off
        configure_logging("info", "json", stream=stream)
        task_prerun.send(sender=None, task_id="T1", task=None, args=[{"batch_id": "B1", "request_ids": ["r1"]}])
        log.info("running")
        task_postrun.send(sender=None, task_id="T1", task=None, args=[], retval=None, state="SUCCESS")
        log.info("between tasks")
    finally:
        uninstall()
    task_prerun.send(sender=None, task_id="T2", task=None, args=[{"batch_id": "B2"}])  # no hook any more
    log.info("after")
    running, between, after = lines(stream)
    assert (running["batch_id"], running["worker"], running["service"]) == ("B1", "gpu0@host", "worker")
    assert "batch_id" not in between and between["worker"] == "gpu0@host"
    assert "batch_id" not in after


def test_celerys_own_lines_about_a_batch_task_carry_its_batch(stream: io.StringIO) -> None:
    configure_logging("info", "json", stream=stream).addFilter(CeleryTaskIds())
    strategy = logging.getLogger("celery.worker.strategy")
    strategy.info("Task %(name)s[%(id)s] received", {"id": "B9", "name": "fusefleet.run_batch", "args": "[]"})
    strategy.info("Task %(name)s[%(id)s] received", {"id": "T1", "name": "some.other_task"})
    batch, other = lines(stream)
    assert batch["message"] == "Task fusefleet.run_batch[B9] received" and batch["batch_id"] == "B9"
    assert "batch_id" not in other
