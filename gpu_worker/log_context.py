"""The worker's log lines carry the worker and the batch they concern (``shared.logging_setup``).

``install_worker_logging`` (called by ``fusefleet worker`` before Celery starts) makes Celery keep fusefleet's
logging instead of its own (no banner on stdout with JSON), names the worker on every line of the process once
Celery knows the node name, and binds each task's batch id for the time the task runs: every line the task's
thread logs carries ``batch_id``. With JSON lines, the pool process also sends the Hugging Face libraries' log
records through the same handler (not their own) and turns their progress bars off (they are not log lines).

Code that hands a batch's work to another thread (the finisher) wraps it in ``carry_context`` to keep the ids;
``log_context(request_id=...)`` (or ``extra=ids(request_id=...)`` on one call) adds a request's.
"""

from __future__ import annotations

import contextvars
import importlib
import importlib.util
import logging
from collections.abc import Callable, Mapping
from typing import Any

from celery.signals import celeryd_init, setup_logging, task_postrun, task_prerun, worker_process_init

from shared.celery_config import RUN_BATCH_TASK
from shared.logging_setup import (
    LogFormat,
    bind_context,
    carry_context,
    configure_logging,
    ids,
    log_context,
    set_process_ids,
    unbind_context,
)

__all__ = ["batch_id_of", "carry_context", "ids", "install_worker_logging", "log_context", "quiet_libraries"]

_bound: dict[str, contextvars.Token[Mapping[str, Any]]] = {}  # task id -> what its prerun bound


def batch_id_of(task_id: str | None, args: Any) -> str | None:
    """The batch a ``fusefleet.run_batch`` task runs: its message's ``batch_id`` (the task id otherwise)."""
    if isinstance(args, list | tuple) and args and isinstance(args[0], dict) and args[0].get("batch_id"):
        return str(args[0]["batch_id"])
    return task_id


class CeleryTaskIds(logging.Filter):
    """Celery's own lines about a batch task (``Task fusefleet.run_batch[<id>] received``, logged where no task
    runs) carry its batch id: the scheduler publishes each batch with the batch id as the task id."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if getattr(record, "batch_id", None) is None and isinstance(args, Mapping):
            if args.get("name") == RUN_BATCH_TASK and args.get("id"):
                record.batch_id = str(args["id"])
        return True


def quiet_libraries() -> None:
    """transformers, diffusers and huggingface_hub (those installed): records through the root logger, no
    progress bars. Imports them: call it where the model is loaded anyway (the pool process)."""
    for name in ("transformers", "diffusers"):
        if importlib.util.find_spec(name) is not None:
            library = importlib.import_module(f"{name}.utils.logging")
            library.disable_default_handler()
            library.enable_propagation()
            library.disable_progress_bar()
    if importlib.util.find_spec("huggingface_hub") is not None:
        importlib.import_module("huggingface_hub.utils").disable_progress_bars()


def install_worker_logging(level: str, log_format: LogFormat) -> Callable[[], None]:
    """Configure this worker's logging (``service`` worker) and the Celery hooks of the module's docstring; returns
    what disconnects the hooks again."""

    def configure(**_: Any) -> None:  # also a receiver: Celery then leaves logging alone (and stdout unredirected)
        configure_logging(level, log_format, service="worker").addFilter(CeleryTaskIds())

    configure()

    def named(sender: str | None = None, instance: Any = None, **_: Any) -> None:
        if sender:
            set_process_ids(worker=str(sender))
        if log_format == "json" and instance is not None:
            instance.quiet = True  # the startup banner is not a log line

    def task_started(task_id: str | None = None, args: Any = None, **_: Any) -> None:
        if task_id is not None:
            _bound[task_id] = bind_context(batch_id=batch_id_of(task_id, args))

    def task_ended(task_id: str | None = None, **_: Any) -> None:
        token = _bound.pop(task_id, None) if task_id is not None else None
        if token is not None:
            try:
                unbind_context(token)
            except ValueError:  # ended in another context than it started: nothing of it is bound here
                pass

    def pool_process_started(**_: Any) -> None:  # connected before the app's own: runs before the model loads
        if log_format == "json":
            quiet_libraries()

    hooks = (
        (setup_logging, configure),
        (celeryd_init, named),
        (worker_process_init, pool_process_started),
        (task_prerun, task_started),
        (task_postrun, task_ended),
    )
    for signal, receiver in hooks:
        signal.connect(receiver, weak=False)  # closures that must live as long as the process

    def uninstall() -> None:
        for signal, receiver in hooks:
            signal.disconnect(receiver)

    return uninstall
