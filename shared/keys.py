"""Every Redis key name and Lua script of fusefleet, in one place.

Contract: ``RedisKeys`` is the only code that spells a key name; the key table, what each key holds and the
invariants the scripts keep together, is docs/architecture.md#redis-key-layout (``tests/unit/test_key_table.py``
holds the two together). A script touches only the keys it is given in ``KEYS``: a script's fixed keys first, then
one ``RequestKeys`` stride per request (``RedisKeys.request_keys``), and ``EndKeys`` (``RedisKeys.end_keys``)
wherever a script may end a request. ``_lua`` puts the generated preamble (status names, the key groups, the time
helper) and a script's libraries before its text (Redis scripts cannot import).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib.resources import files
from typing import NamedTuple, overload

from shared.contracts import RequestStatus

SCHEDULER_GROUP = "scheduler"
SCHEDULER_CONSUMER = "active"  # one consumer name: a new leader inherits its predecessor's pending entries
EVENTS_MAXLEN = 1000
REQUEST_EVENTS_MAXLEN = 64
"""About how many entries a request's event stream keeps (each progress event trims it): small however many steps."""
STEP_SEALED = "sealed"
"""A worker's ``P:step:sets`` field once its running set takes no more joins (a value no step key digest has)."""
WEBHOOK_GROUP = "webhooks"
WEBHOOK_CONSUMER = "active"  # one consumer name, as the scheduler's: a new dispatcher inherits the pending entries


class RequestKeys(NamedTuple):
    """One request's keys as a script takes them in ``KEYS``, in this order (a stride; Lua: ``request_keys``)."""

    hash: str
    events: str
    packed: str  # the name its event stream is copied to for a moment while it is packed (lib_end_request.lua)


class EndKeys(NamedTuple):
    """The fleet keys ending a request touches, in this order (Lua: ``end_keys``, lib_end_request.lua)."""

    metrics: str
    webhooks: str
    inputs: str


class _Key:
    """A key of ``RedisKeys`` that takes no argument: ``{tag}:{suffix}``."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    @overload
    def __get__(self, keys: None, owner: type) -> _Key: ...
    @overload
    def __get__(self, keys: RedisKeys, owner: type) -> str: ...
    def __get__(self, keys: RedisKeys | None, owner: type) -> _Key | str:
        return self if keys is None else f"{keys.tag}:{self.suffix}"


@dataclass(frozen=True, slots=True)
class RedisKeys:
    """The key names of one fleet: every one starts with the hash tag ``{prefix}`` (``tag``), so all of them hash
    to one Redis Cluster slot and any script, pipeline or multi-key command over them touches one node.

    A later shard of a fleet is another ``RedisKeys`` whose ``tag`` is ``{prefix:shardN}``: every key a script
    touches is one ``RedisKeys``'s, so a shard's keys stay together in their slot.
    """

    prefix: str = "fusefleet"

    def __post_init__(self) -> None:
        if "{" in self.prefix or "}" in self.prefix:
            raise ValueError(f"a key prefix cannot hold '{{' or '}}' (it becomes the hash tag): {self.prefix!r}")

    @property
    def tag(self) -> str:
        """What every key name starts with: the Redis Cluster hash tag ``{prefix}`` (the slot is its hash)."""
        return f"{{{self.prefix}}}"

    requests = _Key("requests")
    events = _Key("events")
    inflight = _Key("inflight")
    storing = _Key("storing")
    step_sets = _Key("step:sets")
    step_rows = _Key("step:rows")
    workers = _Key("workers")
    capabilities = _Key("capabilities")
    scheduler_aborted = _Key("scheduler:aborted")
    scheduler_queued = _Key("scheduler:queued")
    scheduler_lease = _Key("scheduler:lease")
    scheduler_processes = _Key("scheduler:processes")
    finished = _Key("finished")
    input_bytes = _Key("inputs:bytes")
    results_journal = _Key("results:journal")
    results_deleting = _Key("results:deleting")
    redis_results_order = _Key("results:redis:order")
    redis_results_sizes = _Key("results:redis:sizes")
    redis_results_used = _Key("results:redis:used")
    metrics = _Key("metrics")
    metrics_recent = _Key("metrics:recent")
    webhooks = _Key("webhooks")
    webhooks_lease = _Key("webhooks:lease")
    videos = _Key("videos")

    def step_inbox(self, worker: str) -> str:
        return f"{self.tag}:step:inbox:{worker}"

    def step_levels(self, worker: str) -> str:
        return f"{self.tag}:step:levels:{worker}"

    def step_open(self, worker: str) -> str:
        """The id of the worker's open running set (``WorkerStore.step_open``), gone when it closes or is dropped:
        what fences a late ``step_reregister.lua``."""
        return f"{self.tag}:step:open:{worker}"

    def step_left(self, worker: str) -> str:
        return f"{self.tag}:step:left:{worker}"

    def worker_quarantine(self, worker: str) -> str:
        """Set while ``worker`` is quarantined (``gpu_worker.app``'s retire; TTL ``worker_quarantine_s``)."""
        return f"{self.tag}:worker:stuck:{worker}"

    def request(self, request_id: str) -> str:
        return f"{self.tag}:req:{request_id}"

    def request_events(self, request_id: str) -> str:
        return f"{self.request(request_id)}:events"

    def request_events_packed(self, request_id: str) -> str:
        """Where ``lib_end_request.lua`` copies a request's event stream to pack it (renamed back at once)."""
        return f"{self.request_events(request_id)}:packed"

    def request_keys(self, request_id: str) -> RequestKeys:
        """The keys of request ``request_id`` as a script wants them: one stride of ``KEYS``."""
        return RequestKeys(
            self.request(request_id), self.request_events(request_id), self.request_events_packed(request_id)
        )

    def request_strides(self, request_ids: Iterable[str]) -> list[str]:
        """The strides of these requests, one after the other (``KEYS`` after a script's fixed keys)."""
        return [key for request_id in request_ids for key in self.request_keys(request_id)]

    @property
    def end_keys(self) -> EndKeys:
        """The fleet keys of ending a request (``lib_end_request.lua``), ``KEYS[1..3]`` of every script that may."""
        return EndKeys(self.metrics, self.webhooks, self.input_bytes)

    def result(self, key: str) -> str:
        """Where the Redis result store keeps the object of result-store key ``key``."""
        return f"{self.tag}:result:{key}"

    def batch(self, batch_id: str) -> str:
        return f"{self.tag}:batch:{batch_id}"

    def batch_lock(self, batch_id: str) -> str:
        return f"{self.tag}:batch:{batch_id}:lock"

    def api_key_bucket(self, name: str) -> str:
        return f"{self.tag}:apikey:{name}:bucket"

    def api_key_unfinished(self, name: str) -> str:
        return f"{self.tag}:apikey:{name}:unfinished"

    def idempotency(self, digest: str) -> str:
        """The record of an Idempotency-Key (``idempotency_claim.lua``), by the digest of its caller and key."""
        return f"{self.tag}:idem:{digest}"

    def api_key_videos(self, name: str) -> str:
        """API key ``name``'s video jobs (``GET /v1/videos``); ``videos`` without API keys."""
        return f"{self.tag}:apikey:{name}:videos"


def _generated() -> str:
    """Lua that every script starts with, generated from the Python that owns each fact: the status names
    (``STATUS.queued`` ..., ``TERMINAL[status]``, from ``RequestStatus``), ``EVENTS_MAXLEN``,
    ``REQUEST_EVENTS_MAXLEN`` and the key groups
    (``request_keys(i)``, ``request_at(fixed, j)``, ``request_count(fixed)``, ``end_keys(i)``, from ``RequestKeys``
    and ``EndKeys``)."""

    def group(name: str, fields: tuple[str, ...]) -> str:
        slots = ", ".join(f"{field} = KEYS[first + {i}]" for i, field in enumerate(fields))
        return f"local function {name}(first) return {{{slots}}} end"

    statuses = ", ".join(f"{s.value} = '{s.value}'" for s in RequestStatus)
    terminal = ", ".join(f"{s.value} = true" for s in RequestStatus if s.terminal)
    stride = len(RequestKeys._fields)
    return "\n".join(
        [
            "-- generated by shared/keys.py (_generated): status names and key groups",
            f"local STATUS = {{{statuses}}}",
            f"local TERMINAL = {{{terminal}}}",
            f"local REQUEST_STRIDE = {stride}",
            f"local EVENTS_MAXLEN = {EVENTS_MAXLEN}  -- about how many entries P:events keeps (every XADD trims it)",
            f"local REQUEST_EVENTS_MAXLEN = {REQUEST_EVENTS_MAXLEN}  -- about how many entries a request's events keep",
            group("request_keys", RequestKeys._fields),
            group("end_keys", EndKeys._fields),
            "-- the j-th request's stride (j from 1) after a script's ``fixed`` keys, and how many strides there are",
            "local function request_at(fixed, j) return request_keys(fixed + (j - 1) * REQUEST_STRIDE + 1) end",
            "local function request_count(fixed) return math.floor((#KEYS - fixed) / REQUEST_STRIDE) end",
        ]
    )


ALWAYS = ("lib_time",)
"""Libraries every script gets (after the generated preamble), so that no script can forget them."""


def _lua(name: str, *libraries: str) -> str:
    """The script ``shared/lua/{name}.lua``, after the generated preamble, ``ALWAYS`` and the library files it
    uses, in that order (Redis scripts cannot import)."""
    folder = files("shared").joinpath("lua")
    parts = [folder.joinpath(f"{part}.lua").read_text(encoding="utf-8") for part in (*ALWAYS, *libraries, name)]
    return "\n".join([_generated(), *parts])


SUBMIT = _lua("submit")
SCHEDULE = _lua("schedule")
CLAIM = _lua("claim", "lib_drop_inputs", "lib_end_request", "lib_split_plan")
PROGRESS = _lua("progress")
FINISH = _lua("finish", "lib_drop_inputs", "lib_end_request")
FAIL = _lua("fail", "lib_drop_inputs", "lib_end_request", "lib_fail_request")
ABORT = _lua("abort", "lib_drop_inputs", "lib_end_request")
EXPIRE = _lua("expire", "lib_drop_inputs", "lib_end_request", "lib_fail_request")
BATCH_DONE = _lua("batch_done")
FORWARD_DONE = _lua("forward_done")
REAP = _lua("reap")
STAMP_PUBLISHED = _lua("stamp_published")
HEARTBEAT = _lua("heartbeat")
FREE_SLOTS = _lua("free_slots")
STEP_JOIN = _lua("step_join")
STEP_CLOSE = _lua("step_close")
STEP_LEAVE = _lua("step_leave")
STEP_SEAL = _lua("step_seal")
STEP_REREGISTER = _lua("step_reregister")
STEP_EVICT = _lua("step_evict")
STEP_SWAP = _lua("step_swap")
REQUEUE = _lua("requeue")
RENEW = _lua("renew")
RELEASE = _lua("release")
GIVE_BACK = _lua("give_back")
RESULTS_RECORD = _lua("results_record")
RESULTS_DUE = _lua("results_due")
FORGET = _lua("forget")
REDIS_RESULT_PUT = _lua("redis_result_put")
REDIS_RESULT_DELETE = _lua("redis_result_delete")
RATE_LIMIT = _lua("rate_limit")
IDEMPOTENCY_CLAIM = _lua("idempotency_claim")
IDEMPOTENCY_SETTLE = _lua("idempotency_settle")
METRICS_ADD = _lua("metrics_add")
WEBHOOK_OUTCOME = _lua("webhook_outcome")


# ``KEYS`` of the scripts called from more than one place (a facade and tests that drive a script directly)


def abort_keys(keys: RedisKeys, request_id: str) -> list[str]:
    """``KEYS`` of ``ABORT``."""
    return [*keys.end_keys, keys.requests, keys.scheduler_aborted, keys.events, *keys.request_keys(request_id)]


def finish_keys(keys: RedisKeys, *request_ids: str) -> list[str]:
    """``KEYS`` of ``FINISH`` ending these requests (one call ends any number of one claim's requests)."""
    return [*keys.end_keys, keys.results_journal, *keys.request_strides(request_ids)]
