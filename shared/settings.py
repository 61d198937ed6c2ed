"""The one settings class of fusefleet: every knob of every service, read from ``FUSEFLEET_*`` variables.

Each service builds ``Settings()`` once at start-up and passes it down; nothing reads the environment elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.contracts import PRIORITY_MAX, PRIORITY_MIN
from shared.logging_setup import LogFormat
from shared.webhook_hosts import HostRules

S3_ATTEMPTS = 3
"""Attempts of each S3 result-store call (botocore's standard retry mode), each waiting at most ``s3_timeout_s`` to
connect and as long for a read, plus up to ``S3_ATTEMPT_SLACK_S``: ``result_store_timeout_s`` must be at least what
they may take together (``Settings.s3_call_bound_s``)."""
S3_ATTEMPT_SLACK_S = 2.0
"""What an S3 attempt may add to its timeouts: botocore's 1 s wait for ``100 Continue`` before a body, its backoff."""


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "fusefleet"


class Settings(BaseSettings):
    """Configuration shared by the api, the scheduler and the workers (env prefix ``FUSEFLEET_``)."""

    # hide_input_in_errors: an invalid setting is named with its rule, never echoed with the other inputs (a Redis URL
    # with its password would be, in part, in every service's start-up error)
    model_config = SettingsConfigDict(env_prefix="FUSEFLEET_", frozen=True, extra="ignore", hide_input_in_errors=True)

    # --- wiring -----------------------------------------------------------------------------------------------
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis (or Valkey) holding the request stream, request state, images and the Celery broker.",
    )
    redis_max_connections: int = Field(
        64,
        ge=2,
        description="Redis connections of one API process; more concurrent calls wait for a free one (not an error).",
    )
    redis_socket_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="Longest wait for one Redis reply: a stalled Redis turns into an error (api: 503 with Retry-After) "
        "after this long instead of a hang. Must exceed scheduler_block_ms.",
    )
    redis_outage_retry_s: float = Field(
        60.0,
        ge=0,
        description="How long a worker keeps retrying to store a finished batch's results while Redis is unreachable; "
        "past it the batch is left to the scheduler's reaper, which publishes it again.",
    )
    key_prefix: str = Field(
        "fusefleet",
        description="Prefix of every Redis key fusefleet writes, and of its Celery queue (queue_name): fleets with "
        "distinct prefixes can share one Redis.",
    )
    queue_name: str = Field(
        "",
        validate_default=True,
        description="Celery queue the scheduler publishes batches to and the workers take them from; unset or empty = "
        "key_prefix + '.batches' (fusefleet.batches), so each fleet on a shared Redis has its own. If set, set the "
        "same on every service of the fleet.",
    )
    log_format: LogFormat = Field(
        "text",
        description="Log lines of every service: 'text' (time level logger: message [ids]) or 'json' (one object a "
        "line: time, level, logger, message, and service, worker, batch_id, request_id where known).",
    )

    # --- batching policy ------------------------------------------------------------------------------------------
    max_num_seqs: int = Field(
        1, ge=1, le=256, description="Most requests fused into one pipeline forward (1 = no batching)."
    )
    request_batch_max_wait_ms: float = Field(
        0.0,
        ge=0.0,
        le=60_000.0,
        description="Upper bound on the admission wait of a new wave: trades first-request latency for fuller batches. "
        "0 dispatches at once.",
    )

    batch_order: Literal["strict", "grouped"] = Field(
        "strict",
        description="'strict': a batch is the oldest request plus the FOLLOWING compatible ones, stopping at the first "
        "incompatible one (vLLM-Omni's FIFO). 'grouped': the oldest request plus any later compatible ones (the head "
        "is still served first, so nothing starves): fuller batches on mixed traffic.",
    )

    step_mode: bool = Field(
        False,
        description="Step-level batching (docs/step_mode.md): the scheduler groups requests by their step key (which "
        "leaves out steps, guidance and output count) and sends compatible requests to a worker's running set, "
        "where they join at the next denoising step and leave when done; at most max_num_seqs requests per set. "
        "Workers whose pipeline has a step-mode adapter (Stable Diffusion 1.x/2.x, SD3) run sets; the others run "
        "each batch request-level, split by compatibility key. Off: request-level batching everywhere.",
    )

    max_batch_pixels: int = Field(
        16_777_216,
        ge=64,
        description="Per-batch pixel budget: the sum of n x width x height (x frames) over a batch's requests. The "
        "scheduler closes a batch before it exceeds it; the api refuses a request that alone exceeds it (422). "
        "Bounds the memory of one fused forward (16 Mi = 64 images of 512x512 or 16 of 1024x1024).",
    )

    scheduling_policy: Literal["priority", "fcfs"] = Field(
        "priority",
        description="'priority': requests wait in levels by their priority, the highest non-empty level is served "
        "first, FIFO within a level, and a batch holds one level only. 'fcfs': one FIFO of arrival order, request "
        "priorities are ignored. Requests that all keep the default priority are served in arrival order either way.",
    )
    default_priority: int = Field(
        0,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description=f"Priority of a request that sets none ({PRIORITY_MIN} lowest .. {PRIORITY_MAX} highest).",
    )
    max_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="Largest timeout_s a request may set (422 above it). A request not started within its timeout_s "
        "fails with Timeout; one still running then is aborted. Requests without timeout_s have no deadline.",
    )

    # --- model and runner ----------------------------------------------------------------------------------------
    model: str | None = Field(
        None,
        description="Local path or hub id of a diffusers text-to-image pipeline; unset = the built-in tiny demo model.",
    )
    demo_family: str = Field(
        "stable-diffusion",
        description="Which tiny random-weight demo pipeline a worker serves when no model is set: stable-diffusion, "
        "stable-diffusion-xl, stable-diffusion-3, flux, pixart, sana, qwen-image or ltx-video (its outputs are noise).",
    )
    model_cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Folder where the demo model is built once and cached (shared by all workers of a host).",
    )
    runner: str = Field(
        "gpu_worker.diffusers_runner:DiffusersRunner",
        description="Import path 'module:Class' of the batch runner the worker uses (custom pipelines, tests).",
    )
    fused: bool | None = Field(
        None,
        description="Force the fused path on (true) or off (false); unset = fused only for pipeline classes known "
        "to accept prompt and generator lists.",
    )
    device: str = Field("auto", description="torch device for the pipeline: 'auto' (cuda when present), 'cpu', 'cuda'.")
    torch_dtype: str = Field(
        "auto", description="'auto' (float16 on cuda, float32 on cpu), 'float32', 'float16', 'bfloat16'."
    )
    torch_threads: int | None = Field(
        None, ge=1, description="torch.set_num_threads in the worker; unset = torch's default."
    )
    sim_base_ms: float = Field(
        50.0,
        ge=0,
        description="Simulated runner only (bench.runners:SimulatedGpuRunner): fixed cost a of t(B) = a + b*B.",
    )
    sim_per_image_ms: float = Field(
        10.0, ge=0, description="Simulated runner only: cost b per output image of t(B) = a + b*B."
    )
    lora_dir: Path | None = Field(
        None,
        description="Folder of LoRA adapters, one sub-folder per adapter name (diffusers save_lora_weights).",
    )

    # --- request limits (the API answers 422 beyond them) -----------------------------------------------------------
    max_image_side: int = Field(2048, ge=8, description="Largest accepted width or height in pixels.")
    max_inference_steps: int = Field(200, ge=1, description="Largest accepted num_inference_steps.")
    max_images_per_request: int = Field(8, ge=1, description="Largest accepted n (images for one prompt).")
    max_num_frames: int = Field(257, ge=1, description="Largest accepted num_frames (frames of one video).")
    max_prompt_chars: int = Field(4000, ge=1, description="Longest accepted prompt or negative prompt.")
    max_body_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="Largest accepted HTTP request body; larger ones get 413.",
    )
    max_input_image_bytes: int = Field(
        10 * 1024 * 1024,
        ge=1024,
        description="Largest accepted input image or mask (decoded bytes, before base64); larger ones get 422.",
    )
    max_input_image_pixels: int = Field(
        4096 * 4096,
        ge=64,
        description="Largest accepted input image or mask in pixels (width x height as stored in the file): bounds "
        "the memory of decoding one. It is then resized to the request's width x height.",
    )
    max_queue_len: int = Field(
        100_000,
        ge=1,
        description="Requests waiting in the stream beyond which submissions get 503 (backpressure).",
    )
    max_queued_input_bytes: int = Field(
        1024**3,
        ge=1024,
        description="Bytes of input images (and masks) that unfinished requests may hold in Redis, as stored (the "
        "client's file when it already has the request's size, else a PNG at that size); a submission past it gets "
        "429 with Retry-After (413 when its own inputs exceed it). Held from submission until the request ends.",
    )

    # --- results ---------------------------------------------------------------------------------------------------
    result_ttl_s: int = Field(86_400, ge=1, description="Seconds a finished request's state and images are kept.")
    result_store: Literal["redis", "filesystem", "s3"] = Field(
        "redis",
        description="Where finished images live: 'redis' (capped by result_redis_max_bytes; simple, one host), "
        "'filesystem' (result_dir, a volume every api and worker host mounts) or 's3' (any S3-compatible object "
        "storage: s3_bucket, s3_endpoint_url). Redis then holds only request state and image keys.",
    )
    result_redis_max_bytes: int = Field(
        1024**3,
        ge=1024,
        description="Redis result store only: bytes of images kept at most; beyond it the oldest are dropped first "
        "(their requests say so, and their image URLs answer 410).",
    )
    result_dir: Path = Field(
        default_factory=lambda: _default_cache_dir() / "results",
        description="Filesystem result store only: the folder of the images (shared by the api and the workers).",
    )
    s3_bucket: str | None = Field(None, description="S3 result store only: the bucket (it must exist).")
    s3_prefix: str = Field("fusefleet/", description="S3 result store only: prefix of every object key.")
    s3_endpoint_url: str | None = Field(
        None, description="S3 result store only: endpoint of a non-AWS service (MinIO, R2, GCS); unset = AWS."
    )
    s3_region: str | None = Field(None, description="S3 result store only: region (unset = boto3's default).")
    s3_path_style: bool = Field(
        True, description="S3 result store only: path-style URLs (MinIO and most non-AWS services want them)."
    )
    s3_timeout_s: float = Field(10.0, gt=0, description="S3 result store only: connect and read timeout per call.")
    result_store_timeout_s: float = Field(
        90.0,
        gt=0,
        description="Filesystem and S3 result stores: the longest one call (a write, a read, a delete) may take; past "
        "it the call fails (reads: 503). A worker whose write did not return counts itself stuck (a hung NFS mount, "
        "an S3 endpoint that stops answering): it withdraws its slot, releases its batches to other workers and "
        "exits, and Celery starts a new pool process. With S3 at least 3 x (2 x s3_timeout_s + 2 s) (3 attempts, "
        "each a connect, a read and botocore's waits), so that the client's own timeouts end a failing call first.",
    )
    result_delivery: Literal["stream", "redirect"] = Field(
        "stream",
        description="How GET /v1/requests/{id}/images/{k} answers: 'stream' the bytes through the api, or "
        "'redirect' (307) to a presigned URL where the store has them (s3); others stream.",
    )
    result_url_ttl_s: int = Field(
        3600, ge=1, le=604_800, description="Lifetime of a presigned image URL (result_delivery=redirect)."
    )
    result_orphan_grace_s: float = Field(
        1800.0,
        gt=0,
        description="A run's stored images that no finished request references (the run died between storing and "
        "finishing, or was fenced off) are deleted this long after the run claimed its batch. Must exceed "
        "batch_time_limit_s + redis_outage_retry_s (the longest a live run takes to finish).",
    )
    result_sweep_interval_s: float = Field(
        10.0, gt=0, description="How often the scheduler's sweeper deletes the images that fell due."
    )

    # --- worker ----------------------------------------------------------------------------------------------------
    worker_name: str | None = Field(
        None,
        description="Celery node name of this worker; unset = fusefleet-worker@<host>-<random>, unique per process.",
    )
    worker_heartbeat_s: float = Field(1.0, gt=0, description="Seconds between worker heartbeats.")
    worker_ttl_s: float = Field(5.0, gt=0, description="A worker silent this long no longer counts as a free slot.")
    worker_quarantine_s: float = Field(
        300.0,
        gt=0,
        description="How long a worker whose result store hung under it (a write past result_store_timeout_s) "
        "counts as no slot: it gives its batches back uncounted (no lost run), and its next pool process takes no "
        "batch until then; then it probes its store with the next batch.",
    )
    batch_time_limit_s: int = Field(
        900,
        ge=10,
        description="Hard limit of one batch task; the soft limit (failing its requests) is 90% of it.",
    )
    visibility_timeout_s: int = Field(
        3600, ge=60, description="Celery Redis visibility timeout; must exceed batch_time_limit_s."
    )
    batch_lock_ttl_s: float = Field(
        10.0,
        gt=0,
        description="TTL of a running batch's ownership lock (renewed by heartbeats): bounds takeover after a crash.",
    )
    max_batch_attempts: int = Field(
        3,
        ge=1,
        description="Lost runs of one request running alone (its worker died, hit the hard time limit or lost "
        "Redis) before it fails WorkerLost: a lost run of several requests is re-run in halves down to one request, "
        "so only the request that kills its worker fails (poison-request guard), and a loss that is not its fault "
        "(a restart) fails a request only if it is lost this many times alone. Deliveries that run nothing do not "
        "count.",
    )
    batch_claim_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A published batch that no worker claimed for this long, and whose message is no longer in the "
        "broker queue (lost), is published again by the scheduler's reaper.",
    )
    worker_start_timeout_s: float = Field(
        900.0,
        gt=0,
        description="How long a worker pool process may take to start (model load included) before Celery gives up "
        "on it (Celery's worker_proc_alive_timeout, 4 s by default, far too short for a real model).",
    )

    # --- scheduler -----------------------------------------------------------------------------------------------
    scheduler_lease_ms: int = Field(
        5000,
        ge=100,
        description="TTL of the active scheduler's lease; a standby takes over within about this long.",
    )
    scheduler_block_ms: int = Field(
        500,
        ge=1,
        le=4000,
        description="Longest blocking stream read of the scheduler between housekeeping rounds.",
    )
    scheduler_read_count: int = Field(1000, ge=1, description="Most stream entries read per round.")

    # --- api -----------------------------------------------------------------------------------------------------
    api_host: str = Field("127.0.0.1", description="Address `fusefleet api` binds when --host is not given.")
    api_port: int = Field(8000, ge=1, le=65535, description="Port `fusefleet api` binds when --port is not given.")
    api_keys_file: Path | None = Field(
        None,
        description="TOML file of the API keys (`fusefleet keys new NAME` mints one): each key's name, the sha256 of "
        "its token, and optional rate_per_s, burst and max_queued. Set: every endpoint but /healthz and /metrics needs "
        "`Authorization: Bearer <token>`, and a key sees only its own requests. Read at start (an invalid file stops "
        "the api) and again within 1 s of a change. Unset or empty: no authentication.",
    )
    max_event_streams: int = Field(
        1000,
        ge=1,
        description="Event streams (GET /v1/requests/{id}/events, GET /v1/events) one api process serves at once; "
        "each holds one Redis connection of its own while it waits. More are refused: 503 with Retry-After.",
    )
    max_event_streams_per_key: int = Field(
        100,
        ge=1,
        description="Event streams one API key (without API keys: one client address) has open at once on one api "
        "process, so that no caller takes all of max_event_streams. More are refused: 429 with Retry-After. Behind a "
        "reverse proxy the address is the proxy's unless uvicorn trusts its X-Forwarded-For (FORWARDED_ALLOW_IPS, "
        "127.0.0.1 by default).",
    )
    max_event_ids: int = Field(
        100, ge=1, le=10_000, description="Most request ids one GET /v1/events stream watches (?ids=); more are a 422."
    )
    event_ping_s: float = Field(
        15.0,
        gt=0,
        le=300,
        description="Seconds between keep-alive comments on a quiet event stream, so proxies keep the connection open.",
    )

    # --- webhooks (docs/operations.md#webhooks) --------------------------------------------------------------------
    webhook_allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Hosts a request's webhook URL may name, comma separated (or a JSON list): host names "
        "(hooks.example.com), sub-domains (*.example.com), * (any host), IP addresses or networks (10.0.0.0/8). Every "
        "address a host is or resolves to must be public unless a listed network contains it (internal addresses "
        "only when listed). Empty: webhooks are off (a request with one gets 422). Needs webhook_secret.",
    )
    webhook_secret: SecretStr | None = Field(
        None,
        description="Key of the HMAC-SHA256 signature of every webhook delivery (header Fusefleet-Signature: "
        "t=<unix s>,v1=<hex of HMAC(secret, '<t>.<body>')>); the receivers verify with it. Required with "
        "webhook_allowed_hosts.",
    )
    webhook_timeout_s: float = Field(
        10.0,
        gt=0,
        le=120,
        description="Connecting to a webhook receiver, sending the delivery and waiting for its answer each take at "
        "most this long (then the attempt failed); also bounds the api's resolution of a webhook host.",
    )
    webhook_max_attempts: int = Field(
        8,
        ge=1,
        le=30,
        description="Attempts of one webhook delivery (any answer but 2xx, a timeout or a refused connection is a "
        "failed attempt) before it is dropped and recorded on the request (webhook_error).",
    )
    webhook_retry_initial_s: float = Field(
        2.0,
        gt=0,
        le=600,
        description="Wait after a delivery's first failed attempt; it doubles after each further one (at most 600 s): "
        "with 8 attempts, 2+4+...+128 = 254 s of waits before a delivery is dropped.",
    )
    webhook_concurrency: int = Field(
        16,
        ge=1,
        le=256,
        description="Webhook deliveries in flight at once (threads of the active dispatcher); one request's events "
        "always go one at a time, in order.",
    )

    @model_validator(mode="after")
    def _timeouts_fit(self) -> Settings:
        if self.redis_socket_timeout_s * 1000 <= self.scheduler_block_ms:
            raise ValueError(
                f"redis_socket_timeout_s ({self.redis_socket_timeout_s}) must exceed scheduler_block_ms "
                f"({self.scheduler_block_ms} ms): the scheduler's blocking read would time out"
            )
        if self.worker_heartbeat_s * 2 > self.batch_lock_ttl_s:
            raise ValueError(
                f"worker_heartbeat_s ({self.worker_heartbeat_s}) must be at most half of batch_lock_ttl_s "
                f"({self.batch_lock_ttl_s}): the heartbeat renews a running batch's lock, which would lapse mid-run"
            )
        if self.result_orphan_grace_s <= self.batch_time_limit_s + self.redis_outage_retry_s:
            raise ValueError(
                f"result_orphan_grace_s ({self.result_orphan_grace_s}) must exceed batch_time_limit_s + "
                f"redis_outage_retry_s ({self.batch_time_limit_s + self.redis_outage_retry_s}): the sweeper would "
                "delete the images of a run that may still finish"
            )
        if self.result_store == "s3" and not self.s3_bucket:
            raise ValueError("result_store 's3' needs s3_bucket (FUSEFLEET_S3_BUCKET)")
        if self.result_store == "s3" and self.result_store_timeout_s < self.s3_call_bound_s:
            raise ValueError(
                f"result_store_timeout_s ({self.result_store_timeout_s}) must be at least {self.s3_call_bound_s:g} s "
                f"with s3_timeout_s {self.s3_timeout_s}: the S3 client may take that long ({S3_ATTEMPTS} attempts) "
                "before it gives up, and a worker would count a failing store as a stuck one"
            )
        if self.visibility_timeout_s <= self.batch_time_limit_s:
            raise ValueError(
                f"visibility_timeout_s ({self.visibility_timeout_s}) must exceed batch_time_limit_s "
                f"({self.batch_time_limit_s}): Celery would deliver a running batch again"
            )
        if self.webhook_allowed_hosts and self.webhook_secret is None:
            raise ValueError(
                "webhook_allowed_hosts needs webhook_secret (FUSEFLEET_WEBHOOK_SECRET): every delivery is signed"
            )
        return self

    @field_validator("queue_name", mode="after")
    @classmethod
    def _queue_follows_prefix(cls, value: str, info: ValidationInfo) -> str:
        """Unset: the fleet's own queue, after its key prefix (two fleets on one Redis never take each other's
        batches)."""
        return value or f"{info.data.get('key_prefix', 'fusefleet')}.batches"

    @field_validator("webhook_secret", mode="before")
    @classmethod
    def _empty_secret_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("webhook_allowed_hosts", mode="before")
    @classmethod
    def _host_list(cls, value: object) -> object:
        """A comma-separated string (or a JSON list) from the environment; each entry must parse (``HostRules``)."""
        if isinstance(value, str):
            value = json.loads(value) if value.strip().startswith("[") else value.split(",")
        if isinstance(value, list):
            value = [str(entry).strip() for entry in value if str(entry).strip()]
            HostRules.parse(value)
        return value

    @field_validator("api_keys_file", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("model_cache_dir", "lora_dir", "result_dir", "api_keys_file", mode="after")
    @classmethod
    def _expand_user(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @property
    def s3_call_bound_s(self) -> float:
        """The longest an S3 result-store call may take by the client's own timeouts and retries."""
        return S3_ATTEMPTS * (2 * self.s3_timeout_s + S3_ATTEMPT_SLACK_S)

    @property
    def webhook_rules(self) -> HostRules:
        """``webhook_allowed_hosts``, parsed (``shared.webhook_hosts``)."""
        return HostRules.parse(self.webhook_allowed_hosts)

    @property
    def model_id(self) -> str:
        """The id of the one model this fleet serves, as requests and workers name it: ``model`` or ``demo``."""
        return self.model or "demo"

    @property
    def soft_time_limit_s(self) -> int:
        """Soft limit of a batch task: the task then fails its unfinished requests itself."""
        return max(1, int(self.batch_time_limit_s * 0.9))

    @property
    def wait_stable_ms(self) -> float:
        """The admission wait's quiet window: dispatch when nothing arrived for this long."""
        return min(50.0, self.request_batch_max_wait_ms / 5.0)
