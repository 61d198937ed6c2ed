"""``fusefleet``: the console entry point of every long-running service.

Each service is configured by ``shared.settings.Settings``: the fleet config file (``--config`` /
``FUSEFLEET_CONFIG``), ``FUSEFLEET_*`` environment variables over it, and on ``api``, ``up``, ``scheduler`` and
``worker`` a flag per setting over both (``fusefleet.settings_flags``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from fusefleet.local_redis import STATE_DIR
from fusefleet.settings_flags import settings_flags
from shared.contracts import OutputFormat
from shared.settings import Settings

cli = typer.Typer(help="fusefleet: a request-batching diffusion serving fleet.", no_args_is_help=True)
LogLevel = Annotated[str, typer.Option(help="Log level.")]
UP_OWN = ("api_host", "api_port", "worker_name")
"""Settings ``up`` sets itself (--host, --port; each worker its own name): not flags of ``up``."""
API_OWN = ("api_host", "api_port")
"""The api's bind address and port: its --host and --port, not flags of their own."""
ApiUrl = Annotated[
    str | None, typer.Option("--url", envvar="FUSEFLEET_URL", help="The api (default http://127.0.0.1:8000).")
]


def _logging(level: str, settings: Settings, service: str) -> None:
    """Text or JSON log lines (``FUSEFLEET_LOG_FORMAT``), each naming the service (``shared.logging_setup``)."""
    from shared.logging_setup import configure_logging

    configure_logging(level, settings.log_format, service=service)


def _settings(settings_env: dict[str, str]) -> Settings:
    """The settings of this process: its flags become its variables (and those of what it starts), then read."""
    os.environ.update(settings_env)
    return Settings()


@cli.command()
@settings_flags(exclude=API_OWN)
def api(
    settings_env: dict[str, str],
    host: Annotated[str | None, typer.Option(help="Bind address (default FUSEFLEET_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Bind port (default FUSEFLEET_API_PORT).")] = None,
    log_level: LogLevel = "info",
) -> None:
    """Run the HTTP API (uvicorn)."""
    import uvicorn

    from api.app import create_app

    settings = _settings(settings_env)
    _logging(log_level, settings, "api")
    uvicorn.run(
        create_app(settings),
        host=host or settings.api_host,
        port=port or settings.api_port,
        log_level=log_level,
        log_config=None,  # uvicorn's loggers go through fusefleet's handler (_logging)
        access_log=False,
    )


@cli.command()
@settings_flags()
def scheduler(settings_env: dict[str, str], log_level: LogLevel = "info") -> None:
    """Run the batching scheduler (one is active per shard; further ones stand by, or lead other shards), the result
    sweeper and the webhook dispatcher (one is active per shard)."""
    from scheduler.app import run_scheduler
    from shared.shards import ShardsError

    settings = _settings(settings_env)
    _logging(log_level, settings, "scheduler")
    try:
        run_scheduler(settings)
    except ShardsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


@cli.command()
@settings_flags()
def worker(settings_env: dict[str, str], log_level: LogLevel = "info") -> None:
    """Run a Celery GPU worker (one batch at a time, the model loaded once)."""
    from gpu_worker.app import run_worker
    from gpu_worker.log_context import install_worker_logging
    from shared.shards import ShardsError

    settings = _settings(settings_env)
    install_worker_logging(log_level, settings.log_format)  # Celery keeps it; each task's lines name its batch
    try:
        run_worker(settings, loglevel=log_level.upper())
    except ShardsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


@cli.command()
@settings_flags(exclude=UP_OWN)
def up(
    settings_env: dict[str, str],
    host: Annotated[str, typer.Option(help="Address of the API.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the API.")] = 8000,
    workers: Annotated[
        int,
        typer.Option(
            envvar="FUSEFLEET_WORKERS",
            min=1,
            help="Worker processes, per shard of a sharded fleet (env FUSEFLEET_WORKERS).",
        ),
    ] = 1,
    state_dir: Annotated[Path, typer.Option(help="Where the embedded Valkey keeps its data and its URL.")] = STATE_DIR,
) -> None:
    """Run the whole fleet locally in the foreground: embedded Valkey (unless FUSEFLEET_REDIS_URL is set), api,
    scheduler and workers, each with the settings given as flags (e.g. --models
    sd=demo:stable-diffusion,pixart=demo:pixart --max-num-seqs 4). Ctrl-C stops everything."""
    from fusefleet.up import run_up

    raise typer.Exit(run_up(host, port, workers, state_dir, settings_env))


@cli.command()
def status(
    state_dir: Annotated[
        Path,
        typer.Option(
            help="State dir of a running `fusefleet up`, whose Redis is read when FUSEFLEET_REDIS_URL is unset."
        ),
    ] = STATE_DIR,
) -> None:
    """Print what the fleet is doing now (queue, batches in flight, each worker and what it serves; in a sharded fleet
    each shard's, under the fleet's totals), read from FUSEFLEET_REDIS_URL, else from the Redis of a `fusefleet up`
    running in this folder, else the default; exits 1 when that Redis does not answer."""
    from fusefleet.local_redis import local_settings
    from fusefleet.status import fleet_status, render_fleet
    from shared.redis_conn import redacted

    current, source = local_settings(state_dir)
    where = f"{redacted(current.redis_url)} ({source})"
    shards = fleet_status(current)
    if shards is None:
        typer.echo(f"error: Redis at {where} does not answer", err=True)
        raise typer.Exit(1)
    typer.echo(f"redis: {where}")
    typer.echo(render_fleet(shards))


@cli.command()
def settings(
    markdown: Annotated[bool, typer.Option(help="A markdown table (docs/configuration.md) instead.")] = False,
) -> None:
    """Print every FUSEFLEET_* setting with its default and meaning (the contents of .env.example)."""
    from fusefleet.settings_doc import render_env_example, render_markdown_table

    typer.echo(render_markdown_table() if markdown else render_env_example(), nl=False)


@cli.command()
def generate(
    prompts: Annotated[list[str], typer.Argument(help="One or more prompts; each is its own request.")],
    n: Annotated[int | None, typer.Option("-n", "--num-images", min=1, help="Images per prompt.")] = None,
    size: Annotated[str | None, typer.Option("--size", help="WIDTHxHEIGHT, e.g. 512x512.")] = None,
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Denoising steps.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0, help="Seed of every request (default: random).")] = None,
    guidance: Annotated[float | None, typer.Option("--guidance", help="Guidance scale.")] = None,
    negative: Annotated[str | None, typer.Option("--negative", help="Negative prompt of every request.")] = None,
    lora: Annotated[str | None, typer.Option("--lora", help="LoRA adapter of the fleet, by name.")] = None,
    lora_scale: Annotated[float | None, typer.Option("--lora-scale", help="Scale of --lora.")] = None,
    image: Annotated[
        Path | None, typer.Option("--image", help="Input image (PNG, JPEG, WebP) for image-to-image.")
    ] = None,
    mask: Annotated[
        Path | None, typer.Option("--mask", help="Inpainting mask (white = repaint); needs --image.")
    ] = None,
    strength: Annotated[
        float | None, typer.Option("--strength", help="How much of --image is replaced (0 < s <= 1).")
    ] = None,
    output_format: Annotated[
        OutputFormat | None, typer.Option("--format", help="Encoding of the images (default png).")
    ] = None,
    quality: Annotated[
        int | None, typer.Option("--quality", min=0, max=100, help="jpeg / webp quality, 0-100; needs --format.")
    ] = None,
    out: Annotated[Path, typer.Option("-o", "--out", help="Folder of the images (created).")] = Path("."),
    prefix: Annotated[
        str | None,
        typer.Option("--prefix", help="Name files <prefix>-<prompt#>-<k>.<format> instead of <id>-<k>.<format>."),
    ] = None,
    url: ApiUrl = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Give up waiting after this many seconds.")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bars on stderr.")] = True,
) -> None:
    """Generate images on a running fleet: each prompt is its own request, all submitted together.

    Writes OUT/<id>-<k>.<format> and prints one line per file; exits 1 when any request failed or was refused.
    """
    from fusefleet.client_cli import GenerateOptions, run_generate

    options = GenerateOptions(
        prompts=prompts,
        out=out,
        url=url,
        n=n,
        size=size,
        steps=steps,
        seed=seed,
        guidance=guidance,
        negative=negative,
        lora=lora,
        lora_scale=lora_scale,
        image=image,
        mask=mask,
        strength=strength,
        output_format=output_format,
        quality=quality,
        prefix=prefix,
        timeout=timeout,
        progress=progress,
    )
    raise typer.Exit(run_generate(options))


@cli.command()
def watch(
    request_ids: Annotated[list[str], typer.Argument(help="One or more request ids.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per event instead of a text line.")] = False,
    last_event_id: Annotated[
        str | None, typer.Option("--last-event-id", help="Resume after this event (its last_event_id in --json).")
    ] = None,
    url: ApiUrl = None,
) -> None:
    """Print the live events of requests (queued, scheduled, running, progress, then succeeded, failed or aborted)
    as they happen, until each ended; exits 1 unless all succeeded."""
    from fusefleet.client_cli import run_watch

    raise typer.Exit(run_watch(url, request_ids, as_json=as_json, last_event_id=last_event_id))


keys = typer.Typer(help="API keys of the api (FUSEFLEET_API_KEYS_FILE).", no_args_is_help=True)
cli.add_typer(keys, name="keys")


@keys.command("new")
def keys_new(
    name: Annotated[str, typer.Argument(help="The key's name (letters, digits, _ and -): recorded on its requests.")],
    rate_per_s: Annotated[
        float | None, typer.Option("--rate-per-s", help="Submitted requests per second, sustained (default: no limit).")
    ] = None,
    burst: Annotated[
        int | None, typer.Option("--burst", help="Requests at once, with --rate-per-s (default: the rate rounded up).")
    ] = None,
    max_queued: Annotated[
        int | None, typer.Option("--max-queued", help="Requests queued, scheduled or running at once (default: none).")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", help="Add the key to this keys file (created when missing).")
    ] = None,
) -> None:
    """Mint an API key: print its token once (stdout) and the table to add to the keys file, or add it (--file)."""
    from fusefleet.keys_cli import run_new

    raise typer.Exit(run_new(name, rate_per_s, burst, max_queued, file))


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
