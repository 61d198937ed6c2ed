"""The models a fleet serves, which of them a worker loads, and the runner that turns their batches into images.

A fleet's models are data (``models``: name -> source, docs/models.md): a source is a diffusers pipeline (a local
path or hub id) or ``demo:<family>``, a tiny demo pipeline of ``demo_models/catalog.py``. Unset, the fleet serves the
one model of ``model`` / ``demo_family`` under the name ``model_id`` (as before several models). ``model_id`` is the
default model, what a request that names none is for; ``served_models`` are those a worker loads at start.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from shared.settings.concern import EmptyIsUnset, OptionalUserPath, SettingsConcern, UserPath, default_cache_dir

DEMO_SOURCE = "demo:"
"""A source ``demo:<family>`` is the tiny demo pipeline of that family."""
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A model name of ``models``: it names the model's Celery queue (``shared.routing``) and appears in URLs."""


def _pairs(
    value: object, field: str = "models", example: str = "name=source (e.g. sd=demo:stable-diffusion)"
) -> object:
    """``name=value`` pairs, comma separated, or a JSON object, as the environment gives them (``field`` and
    ``example`` name them in an error)."""
    if not isinstance(value, str):
        return value
    if value.strip().startswith("{"):
        return json.loads(value)
    pairs: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, equals, source = item.partition("=")
        if not equals:
            raise ValueError(f"{field}: {item!r} is not {example}")
        if name.strip() in pairs:
            raise ValueError(f"{field}: {name.strip()!r} is named twice")
        pairs[name.strip()] = source.strip()
    return pairs


def _shard_names(model: str, shards: object) -> object:
    """A model's shards of ``model_shards``: one name, several with '|' between them, or a list of names."""
    if isinstance(shards, str):
        shards = shards.split("|")
    if not isinstance(shards, list | tuple):
        return shards
    names = [str(shard).strip() for shard in shards]
    if len(set(names)) < len(names):
        raise ValueError(f"model_shards: {model!r} names a shard twice ({'|'.join(names)})")
    return tuple(names)


def _names(value: object) -> object:
    """A comma-separated list (or a JSON list) of model names, as the environment gives it."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip().startswith("[") else value.split(",")
    if isinstance(value, list):
        return [str(name).strip() for name in value if str(name).strip()]
    return value


class ModelSettings(SettingsConcern):
    """The fleet's models (or its one pipeline), the runner, the device and the LoRA adapters."""

    section = "Model and runner"

    models: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    """The fleet's models: name=source pairs, comma separated (or a JSON object), e.g.
    'sd=demo:stable-diffusion,pixart=demo:pixart'. A source is a diffusers pipeline (local path or hub id) or
    demo:<family> (a tiny demo pipeline, docs/models.md); a name is letters, digits, '.', '_' and '-' (at most 64,
    starting with a letter or digit). Empty: the one model of model / demo_family. Set the same on every service."""

    default_model: Annotated[str | None, EmptyIsUnset] = None
    """The model a request that names none is for: one of models; unset = the first."""

    worker_models: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """The models a worker serves, by name, comma separated: it loads each at start and takes only their batches.
    Empty = every model of the fleet."""

    model_shards: Annotated[dict[str, tuple[str, ...]], NoDecode] = Field(default_factory=dict)
    """Which Redis shards hold each model's requests: model=shard pairs, comma separated (or a JSON object, a list
    for several shards), e.g. 'sd=images,pixart=images,sana=fast'. A model whose traffic needs more than one
    scheduler names several shards, '|' between them ('sd=sd-0|sd-1|sd-2'): each new request goes to one of them at
    random. A shard has keys of its own (one hash slot on a Redis Cluster), its own scheduler lease and reaper; a
    model named in none stays in the fleet's own keys. A worker's models must share one shard (worker_shard says
    which when they share several). Empty: one shard, the fleet's keys (docs/architecture.md#shards). Set the same
    on every service."""

    worker_shard: Annotated[str | None, EmptyIsUnset] = None
    """The shard of model_shards a worker serves, one its models are all in: needed only when they share several
    (a model of several shards has workers in each). Unset = their one shard."""

    max_resident_models: int | None = Field(None, ge=1)
    """How many of the models a worker serves it keeps loaded at once (least recently used evicted first, a model
    loaded again when a batch of it comes); unset = all of them (docs/models.md#residency)."""

    min_residency_s: float = Field(10.0, ge=0)
    """A model a worker loaded stays loaded at least this long (no eviction sooner), so alternating batches of two
    models cannot make it load and evict on every batch."""

    model: Annotated[str | None, EmptyIsUnset] = None
    """Local path or hub id of a diffusers text-to-image pipeline, the fleet's one model when models is empty; unset =
    the built-in tiny demo model."""

    demo_family: str = "stable-diffusion"
    """Which tiny random-weight demo pipeline a worker serves when neither models nor model is set, by family name
    (docs/models.md lists them; its outputs are noise)."""

    model_cache_dir: UserPath = Field(default_factory=default_cache_dir)
    """Folder where the demo model is built once and cached (shared by all workers of a host)."""

    runner: str = "gpu_worker.diffusers_runner:DiffusersRunner"
    """Import path 'module:Class' of the batch runner the worker uses (custom pipelines, tests)."""

    fused: bool | None = None
    """Force the fused path on (true) or off (false); unset = fused only for pipeline classes known to accept prompt and
    generator lists."""

    device: str = "auto"
    """torch device for the pipeline: 'auto' (cuda when present), 'cpu', 'cuda'."""

    torch_dtype: str = "auto"
    """'auto' (float16 on cuda, float32 on cpu), 'float32', 'float16', 'bfloat16'."""

    torch_threads: int | None = Field(None, ge=1)
    """torch.set_num_threads in the worker; unset = torch's default."""

    lora_dir: OptionalUserPath = None
    """Folder of LoRA adapters, one sub-folder per adapter name (diffusers save_lora_weights)."""

    @field_validator("models", mode="before")
    @classmethod
    def _models_from_env(cls, value: object) -> object:
        return _pairs(value)

    @field_validator("model_shards", mode="before")
    @classmethod
    def _model_shards_from_env(cls, value: object) -> object:
        pairs = _pairs(value, "model_shards", "model=shard (e.g. sd=images, or sd=sd-0|sd-1)")
        if not isinstance(pairs, dict):
            return pairs
        return {model: _shard_names(model, shards) for model, shards in pairs.items()}

    @field_validator("worker_models", mode="before")
    @classmethod
    def _worker_models_from_env(cls, value: object) -> object:
        return _names(value)

    @model_validator(mode="after")
    def _models_are_named(self) -> Self:
        for name, source in self.models.items():
            if not MODEL_NAME.fullmatch(name):
                raise ValueError(
                    f"models: {name!r} is not a model name (letters, digits, '.', '_', '-'; at most 64, starting "
                    "with a letter or digit)"
                )
            if not source or source == DEMO_SOURCE:
                raise ValueError(f"models: {name!r} has no source (a diffusers path or hub id, or demo:<family>)")
        if self.models and self.model:
            raise ValueError("model is set beside models: name that pipeline in models (name=source) instead")
        known = self.catalog
        if self.default_model is not None and self.default_model not in known:
            raise ValueError(f"default_model {self.default_model!r} is not one of models ({', '.join(known)})")
        unknown = [name for name in self.worker_models if name not in known]
        if unknown:
            raise ValueError(f"worker_models names {', '.join(unknown)}, not among models ({', '.join(known)})")
        unknown = [name for name in self.model_shards if name not in known]
        if unknown:
            raise ValueError(f"model_shards names {', '.join(unknown)}, not among models ({', '.join(known)})")
        for shard in (shard for shards in self.model_shards.values() for shard in shards):
            if not MODEL_NAME.fullmatch(shard):
                raise ValueError(
                    f"model_shards: {shard!r} is not a shard name (letters, digits, '.', '_', '-'; at most 64, "
                    "starting with a letter or digit)"
                )
        named = {shard for shards in self.model_shards.values() for shard in shards}
        if self.worker_shard is not None and self.worker_shard not in named:
            shown = ", ".join(map(repr, sorted(named))) or "none"
            raise ValueError(f"worker_shard {self.worker_shard!r} is not a shard of model_shards ({shown})")
        if self.worker_models and not self.common_shards:
            spanned = sorted({shard for name in self.served_models for shard in self.shards_of(name)})
            shown = ", ".join(repr(shard) if shard else "the fleet's own" for shard in spanned)
            raise ValueError(f"worker_models span shards {shown}: a worker's models must share one shard")
        return self

    @property
    def catalog(self) -> dict[str, str]:
        """Every model of the fleet, name -> source, in order: ``models``, or the one of ``model`` / ``demo_family``
        under ``model``'s own name or ``demo``."""
        if self.models:
            return dict(self.models)
        return {self.model or "demo": self.model or f"{DEMO_SOURCE}{self.demo_family}"}

    @property
    def model_id(self) -> str:
        """The fleet's default model, as requests and workers name it: ``default_model``, else the first of
        ``catalog`` (``model`` or ``demo`` when ``models`` is empty)."""
        return self.default_model or next(iter(self.catalog))

    @property
    def served_models(self) -> tuple[str, ...]:
        """The models a worker of these settings serves: ``worker_models``, or every model of the fleet."""
        return tuple(self.worker_models) or tuple(self.catalog)

    def shards_of(self, name: str) -> tuple[str, ...]:
        """The shards holding model ``name``'s requests (``model_shards``; ``("",)``, the fleet's own keys, for a model
        it does not name)."""
        return self.model_shards.get(name, ("",))

    @property
    def common_shards(self) -> tuple[str, ...]:
        """The shards every one of ``served_models`` is in, in the order the first names them (the ones a worker of
        these settings may serve)."""
        first, *rest = (self.shards_of(name) for name in self.served_models)
        return tuple(shard for shard in first if all(shard in shards for shards in rest))

    def for_model(self, name: str) -> Self:
        """These settings as a runner of model ``name`` reads them: ``model`` its source, or unset with
        ``demo_family`` its family for a ``demo:`` source (KeyError for a name that is not in ``catalog``)."""
        source = self.catalog[name]
        if source.startswith(DEMO_SOURCE):
            return self.model_copy(update={"model": None, "demo_family": source.removeprefix(DEMO_SOURCE)})
        return self.model_copy(update={"model": source})
