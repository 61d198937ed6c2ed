"""The compatibility key: requests with equal keys may share one fused pipeline forward.

The key holds every field that must be a scalar for the whole pipeline call (shape, frames and fps, steps, guidance
and true CFG, prompt sequence length, output count, task and strength) and the presence of a negative prompt. The
task says whether the call is text-to-image, image-to-image or inpainting (a mask is present exactly for
inpainting). Prompt text, negative-prompt text, seed, the input image and mask themselves, the LoRA adapter and its
scale, and the output encoding (format and quality, applied to each request's images after the forward) are per row
and may differ inside a batch (the api resizes every input image to the request's output size, so images of one
batch have one size). The worker applies each row's own adapter in the one fused forward (``gpu_worker.lora``:
peft's per-row ``adapter_names``); a pipeline that cannot mix adapters runs the batch's rows grouped by adapter
inside the worker. The step key leaves it out too: a step-engine row carries its own adapter, applied per row in
the prompt encoders and the denoiser (``gpu_worker.step_engine``). It leaves out task and strength too for a request
whose task the model's step rows carry themselves (``ModelTraits.step_tasks``, from its step-engine adapter; none
announced: they stay in, the safe default).

Both keys are derived: their fields are the ``RequestSpec`` fields marked ``BatchKey`` (``shared.contracts``), in
field order, so a new batch-wide parameter is one marked field there and nothing here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from dataclasses import Field, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from shared.contracts import BatchKey, RequestSpec, Task


@dataclass(frozen=True, slots=True)
class KeyField:
    """One field of a batch key: a ``BatchKey``-marked ``RequestSpec`` field (``field``), its presence, or one
    attribute of its value (``part``; None when the field is unset)."""

    name: str
    field: str
    presence: bool = False
    part: str | None = None
    row_task: bool = False  # left out of the step key (None) where the model's step rows carry the request's task

    def value(self, spec: RequestSpec) -> Any:
        value = getattr(spec, self.field)
        if self.presence:
            return value is not None
        if self.part is not None:
            return None if value is None else getattr(value, self.part)
        return value


def _key_fields(marker: BatchKey, field: str) -> list[KeyField]:
    if marker.presence:
        return [KeyField(f"has_{field}", field, presence=True, row_task=marker.row_task)]
    if marker.parts:
        return [KeyField(f"{field}_{part}", field, part=part, row_task=marker.row_task) for part in marker.parts]
    return [KeyField(field, field, row_task=marker.row_task)]


def _marked(keep: Callable[[BatchKey], bool]) -> tuple[KeyField, ...]:
    """The key fields of every ``RequestSpec`` field with a ``BatchKey`` that ``keep`` accepts, in field order."""
    return tuple(
        key_field
        for name, info in RequestSpec.model_fields.items()
        for marker in info.metadata
        if isinstance(marker, BatchKey) and keep(marker)
        for key_field in _key_fields(marker, name)
    )


COMPAT_FIELDS = _marked(lambda marker: marker.forward)
"""The compatibility key's fields: the ``BatchKey(forward=True)`` fields of ``RequestSpec``."""
STEP_FIELDS = _marked(lambda marker: marker.step)
"""The step key's fields: the ``BatchKey(step=True)`` fields of ``RequestSpec``."""


class _Key:
    """Base of the batch keys: frozen dataclasses whose fields are the marked ones, as named by ``KeyField``."""

    __slots__ = ()

    if TYPE_CHECKING:  # the fields are generated from the markers
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

        def __getattr__(self, name: str) -> Any: ...


_K = TypeVar("_K", bound=_Key)


def _key_class(key_fields: tuple[KeyField, ...]) -> Callable[[type[_K]], type[_K]]:
    """A class decorator: the class as a frozen, slotted dataclass with one field per key field, in order."""

    def build(cls: type[_K]) -> type[_K]:
        cls.__annotations__ = {key_field.name: Any for key_field in key_fields}
        return dataclass(frozen=True, slots=True)(cls)

    return build


@_key_class(COMPAT_FIELDS)
class CompatKey(_Key):
    """Hashable batching bucket of a request (``compat_key``)."""


def key_model(key: object) -> str | None:
    """The model of a batch key (``CompatKey.model``, ``StepKey.model``); None for a key without one."""
    model = getattr(key, "model", None)
    return None if model is None else str(model)


def compat_key(spec: RequestSpec) -> CompatKey:
    """The batching bucket of ``spec`` (its LoRA adapter is per row: not in the key)."""
    return CompatKey(*(key_field.value(spec) for key_field in COMPAT_FIELDS))


def output_pixels(n: int, width: int, height: int, num_frames: int | None = None) -> int:
    """What a request adds to a fused forward's memory: output pixels, ``n x width x height (x frames)``.

    The per-batch budget ``max_batch_pixels`` is a bound on the sum of these (the scheduler closes a batch
    before it exceeds it; the api refuses a request that alone exceeds it).
    """
    return n * width * height * (num_frames or 1)


def pixel_cost(spec: RequestSpec) -> int:
    """``output_pixels`` of a stored request."""
    return output_pixels(spec.n, spec.width, spec.height, spec.num_frames)


# --- step mode -------------------------------------------------------------------------------------------------

_COMPAT_NAMES = frozenset(key_field.name for key_field in COMPAT_FIELDS)
_STEP_NAMES = frozenset(key_field.name for key_field in STEP_FIELDS)
PER_ROW: frozenset[str] = _COMPAT_NAMES - _STEP_NAMES
"""The compatibility-key fields a row of the step engine carries itself (its own scheduler and step count, its own
guidance, a request is ``n`` rows, a guided row without a negative prompt is guided by the empty prompt), so they
do not split a running set: ``BatchKey(step=False)``."""

STEP_ONLY: frozenset[str] = _STEP_NAMES - _COMPAT_NAMES
"""The step-key fields that are not compatibility-key fields (``BatchKey(forward=False)``): none since a step row
carries its LoRA adapter itself. :class:`StepKey`'s fields are exactly the :class:`CompatKey` fields less
:data:`PER_ROW`, plus these."""


@_key_class(STEP_FIELDS)
class StepKey(_Key):
    """Step-mode bucket of a request: what one running set's fused denoiser calls cannot mix (size, frames, prompt
    sequence length, the model; task and strength unless the model's rows carry them: None then). Requests with
    equal step keys may share one running set (``docs/step_mode.md``)."""

    @property
    def digest(self) -> str:
        """A short stable name of the key, the same in every process (how Redis names a running set's key)."""
        text = "|".join(f"{field.name}={getattr(self, field.name)!r}" for field in fields(self))
        return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]


def step_key(spec: RequestSpec, step_tasks: Collection[Task] = ()) -> StepKey:
    """The step-mode bucket of ``spec``: its compatibility key without the per-row fields, and without its task and
    strength (``BatchKey(row_task=True)``: None) when ``step_tasks`` (its model's ``ModelTraits.step_tasks``; empty:
    unknown) holds its task."""
    carried = spec.task in step_tasks
    return StepKey(*(None if carried and f.row_task else f.value(spec) for f in STEP_FIELDS))
