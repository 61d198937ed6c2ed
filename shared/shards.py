"""Shards: a fleet's requests split by model across keyspaces of their own (docs/architecture.md#shards).

A shard is a keyspace of the fleet with everything a request touches: its stream, its in-flight set, its
scheduler lease and reaper, its batches, events, metrics, webhooks and results. Shard ``s`` of a fleet with key
prefix ``p`` is the prefix ``p:s`` (the hash tag ``{p:s}``: one Redis Cluster slot, so different shards land on
different nodes) and the Celery queue ``<queue_name>:s``; the fleet's own prefix ``p`` is the shard ``""``, which
holds every model no shard names (``model_shards``), so a fleet without shards is exactly one shard, as before.

Each service composes per-shard copies of what it ran before: ``Shards.settings_of(shard)`` is the fleet's
settings with the shard's prefix and queue, and everything built from them (a scheduler, a worker, a request
store) works inside that shard only. The api holds one per shard and routes: a submission by its model
(``new_request_id_of``: a model of several shards spreads its new requests over them, ``spread``), everything else by
the request id, which says its shard (``shard_of_request``: a sharded
fleet's ids start with their shard's ``mark``, four hex digits of a hash of its name, so a read goes straight to
it). A worker serves the models of one shard (``shard_of_worker``; ``worker_shard`` picks it
when they share several); a scheduler process leads any of them
(``scheduler.shard_leaders``).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from shared.settings import Settings

HOME = ""
"""The fleet's own keyspace, as a shard name: the models no shard names."""
MARK_DIGITS = 4
"""Hex digits of a sharded fleet's request id that say its shard."""
ID_BYTES = 16
"""A request id's random bytes (32 hex digits), whose first ``MARK_DIGITS`` digits a sharded fleet sets."""


def spread(shards: Sequence[str], token: str) -> str:
    """The one of ``shards`` a new request goes to, picked by ``token``, its random hex digits: their number modulo
    the count of shards, so random tokens spread the requests evenly over them."""
    return shards[int(token, 16) % len(shards)]


def shard_mark(shard: str) -> str:
    """The first ``MARK_DIGITS`` hex digits of the ids of ``shard``'s requests: a hash of its name (so a shard's
    ids do not change when others are added or removed)."""
    return hashlib.blake2s(f"fusefleet-shard:{shard}".encode(), digest_size=MARK_DIGITS // 2).hexdigest()


def _shown(shards: Iterable[str]) -> str:
    """Shard names as an error message lists them."""
    return ", ".join(repr(shard) if shard else "the fleet's own" for shard in shards)


class ShardsError(ValueError):
    """A shard layout that cannot work (two shards whose names hash to one mark, a worker whose models span
    shards)."""


@dataclass(frozen=True)
class Shards:
    """The shards of the fleet of ``settings``: names, each shard's models and settings, and the routes to them."""

    settings: Settings

    def __post_init__(self) -> None:
        marks: dict[str, str] = {}
        for shard in self.names:
            other = marks.setdefault(shard_mark(shard), shard)
            if other != shard:
                raise ShardsError(f"model_shards: shards {other!r} and {shard!r} have one id mark; rename one")

    @cached_property
    def names(self) -> tuple[str, ...]:
        """Every shard of the fleet, the fleet's own (``HOME``) first when some model is in it, then in the order
        ``model_shards`` first names them."""
        named = tuple(dict.fromkeys(shard for shards in self.settings.model_shards.values() for shard in shards))
        home = any(model not in self.settings.model_shards for model in self.settings.catalog)
        return ((HOME,) if home else ()) + named

    @property
    def sharded(self) -> bool:
        """Whether the fleet has shards of its own (``model_shards`` set): its ids then carry their shard's mark."""
        return bool(self.settings.model_shards)

    def models_of(self, shard: str) -> tuple[str, ...]:
        """The models whose requests ``shard`` holds (alone or with other shards), in catalog order."""
        return tuple(model for model in self.settings.catalog if shard in self.shards_of_model(model))

    def shards_of_model(self, model: str) -> tuple[str, ...]:
        """The shards holding ``model``'s requests: one, or several that a model's traffic needs."""
        return self.settings.shards_of(model)

    def shard_of_model(self, model: str) -> str:
        """The one shard holding ``model``'s requests; ShardsError for a model of several (its new requests spread
        over them: ``new_request_id_of``)."""
        shards = self.shards_of_model(model)
        if len(shards) > 1:
            raise ShardsError(f"model {model!r} is in shards {', '.join(map(repr, shards))}, not one")
        return shards[0]

    def shard_of_request(self, request_id: str) -> str | None:
        """The shard a request id says: the one whose mark it starts with (the fleet's own, unsharded); None for an
        id of a sharded fleet that starts with no shard's mark (no request of this fleet has it)."""
        if not self.sharded:
            return HOME
        return self._by_mark.get(request_id[:MARK_DIGITS])

    def new_request_id(self, shard: str) -> str:
        """A fresh request id of ``shard``: random hex, its first digits the shard's mark in a sharded fleet."""
        random_hex = secrets.token_hex(ID_BYTES)
        return shard_mark(shard) + random_hex[MARK_DIGITS:] if self.sharded else random_hex

    def new_request_id_of(self, model: str) -> str:
        """A fresh request id of a new request of ``model``, in its shard, or for a model of several in the one a
        fresh random token picks (``spread``: each of them as likely); ``shard_of_request`` reads it back."""
        return self.new_request_id(spread(self.shards_of_model(model), secrets.token_hex(ID_BYTES)))

    def shard_of_worker(self) -> str:
        """The shard a worker of these settings serves: ``worker_shard``, else the one shard its models
        (``served_models``) share. ShardsError when they share none (name a shard's models in ``worker_models``), when
        they share several and ``worker_shard`` is unset, or when it is not one of those they share."""
        common = self.settings.common_shards
        if not common:
            spanned = dict.fromkeys(s for m in self.settings.served_models for s in self.shards_of_model(m))
            raise ShardsError(
                f"this worker's models span shards ({_shown(spanned)}): a worker serves one shard's models, so set "
                "worker_models to the models of one shard"
            )
        chosen = self.settings.worker_shard
        if chosen is None and len(common) > 1:
            raise ShardsError(
                f"this worker's models are in shards {_shown(common)}: a worker serves one, so set "
                "worker_shard (FUSEFLEET_WORKER_SHARD) to the one it serves"
            )
        if chosen is not None and chosen not in common:
            raise ShardsError(
                f"worker_shard {chosen!r} is not a shard of all this worker's models (they share {_shown(common)})"
            )
        return chosen if chosen is not None else common[0]

    def settings_of(self, shard: str) -> Settings:
        """The fleet's settings inside ``shard``: its key prefix (``<prefix>:<shard>``) and Celery queue
        (``<queue_name>:<shard>``); the fleet's own shard keeps the fleet's."""
        if shard == HOME:
            return self.settings
        if shard not in self.names:
            raise KeyError(f"no shard {shard!r} in this fleet ({', '.join(map(repr, self.names))})")
        return self.settings.model_copy(
            update={
                "key_prefix": f"{self.settings.key_prefix}:{shard}",
                "queue_name": f"{self.settings.queue_name}:{shard}",
            }
        )

    @cached_property
    def _by_mark(self) -> dict[str, str]:
        return {shard_mark(shard): shard for shard in self.names}
