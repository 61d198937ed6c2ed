"""Which tasks a model's step rows carry themselves, as the scheduler keys step mode by them: per model, the tasks
every live worker serving it announces (``ModelTraits.step_tasks``; a batch may run on any of them, so a task one
of them keeps in its step key stays in the scheduler's too). A model no live worker announces carries none: task
and strength stay in its step key, the safe default. Pure: the announcements in, a lookup out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.contracts import Task, WorkerCapabilities


@dataclass(frozen=True, slots=True)
class RowTasks:
    """The announced step-row tasks by model (the common part over its live workers)."""

    tasks: Mapping[str, frozenset[Task]] = field(default_factory=dict)
    only_model: str | None = None  # the fleet's one model, for requests that name none

    @classmethod
    def of(cls, announced: Mapping[str, WorkerCapabilities]) -> RowTasks:
        tasks: dict[str, frozenset[Task]] = {}
        for capabilities in announced.values():
            for served in capabilities.served:
                mine = frozenset(served.traits.step_tasks)
                tasks[served.model] = tasks[served.model] & mine if served.model in tasks else mine
        return cls(tasks, next(iter(tasks)) if len(tasks) == 1 else None)

    def of_model(self, model: str | None) -> frozenset[Task]:
        """The tasks whose requests of ``model`` leave task and strength out of their step key (empty: unknown)."""
        name = model or self.only_model
        return frozenset() if name is None else self.tasks.get(name, frozenset())
